// Enumeration of legal plans.
#include "sextant/planner/search_space.hpp"

#include <fmt/format.h>

#include <regex>

#include "sextant/spec/limits.hpp"

namespace sextant::planner {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  }
  std::sort(d.begin(), d.end());
  return d;
}

int64_t model_layers(const spec::ModelSpec& m) {
  switch (m.kind()) {
    case spec::ModelKind::kTransformer:
      return m.transformer().layers;
    case spec::ModelKind::kMlp:
      return static_cast<int64_t>(m.mlp().widths.size()) - 1;
    case spec::ModelKind::kCnn: {
      int64_t units = 0;
      for (const spec::CnnLayer& l : m.cnn().layers)
        units += l.kind == spec::CnnLayerKind::kBottleneck ? l.blocks : 1;
      return units;
    }
  }
  return 1;
}

int64_t value_of(const spec::Plan& p, Constraint::Dim d) {
  switch (d) {
    case Constraint::Dim::kDp:
      return p.dp;
    case Constraint::Dim::kTp:
      return p.tp;
    case Constraint::Dim::kPp:
      return p.pp;
    case Constraint::Dim::kZero:
      return p.zero;
    case Constraint::Dim::kMicroBatch:
      return p.micro_batch;
    case Constraint::Dim::kVpp:
      return p.virtual_stages;
  }
  return 0;
}

}  // namespace

bool Constraint::allows(const spec::Plan& plan) const {
  int64_t v = value_of(plan, dim);
  switch (op) {
    case Op::kLess:
      return v < value;
    case Op::kLessEqual:
      return v <= value;
    case Op::kEqual:
      return v == value;
    case Op::kGreaterEqual:
      return v >= value;
    case Op::kGreater:
      return v > value;
  }
  return true;
}

Constraint parse_constraint(const std::string& text) {
  static const std::regex pattern(R"(^\s*(dp|tp|pp|zero|mb|vpp)\s*(<=|>=|==|=|<|>)\s*(\d+)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, pattern)) {
    throw InputError("command line", "--constraint", text,
                     "expected <dim><op><integer> with dim one of dp, tp, pp, zero, mb, vpp and "
                     "op one of <=, <, =, >=, > (e.g. tp<=8)");
  }
  Constraint c{};
  const std::string dim = m[1];
  c.dim = dim == "dp"     ? Constraint::Dim::kDp
          : dim == "tp"   ? Constraint::Dim::kTp
          : dim == "pp"   ? Constraint::Dim::kPp
          : dim == "zero" ? Constraint::Dim::kZero
          : dim == "mb"   ? Constraint::Dim::kMicroBatch
                          : Constraint::Dim::kVpp;
  const std::string op = m[2];
  c.op = op == "<"    ? Constraint::Op::kLess
         : op == "<=" ? Constraint::Op::kLessEqual
         : op == ">"  ? Constraint::Op::kGreater
         : op == ">=" ? Constraint::Op::kGreaterEqual
                      : Constraint::Op::kEqual;
  c.value = std::stoll(m[3]);
  return c;
}

void check_request(const SearchRequest& r) {
  Diagnostics diag("request");
  if (r.gpus < 1) diag.add("--gpus", std::to_string(r.gpus), "must be >= 1");
  if (r.global_batch < 1 || r.global_batch > spec::kMaxGlobalBatch)
    diag.add("--global-batch", std::to_string(r.global_batch),
             fmt::format("must be in [1, {}]", spec::kMaxGlobalBatch));
  if (r.seq_len)
    if (std::string problem = spec::seq_len_problem(r.model, *r.seq_len); !problem.empty())
      diag.add("--seq-len", std::to_string(*r.seq_len), problem);
  if (r.gpus > r.cluster.total_devices()) {
    diag.add("--gpus", std::to_string(r.gpus),
             fmt::format("cluster {} has {} devices ({} nodes x {})", r.cluster.name,
                         r.cluster.total_devices(), r.cluster.nodes, r.cluster.devices_per_node));
  }
  diag.throw_if_any();
}

std::vector<int64_t> balanced_split(int64_t layers, int64_t chunks) {
  if (chunks < 3 || layers < 2 * chunks) return {};
  // The first and last chunk each give one layer to the middle ones (Megatron-LM lets users
  // shorten the first and last stages for the embedding and the output layer the same way).
  std::vector<int64_t> counts(static_cast<size_t>(chunks), 0);
  int64_t rest = layers - 2 * (layers / chunks - 1);
  counts.front() = counts.back() = layers / chunks - 1;
  int64_t middle = chunks - 2;
  for (int64_t i = 0; i < middle; ++i)
    counts[static_cast<size_t>(i + 1)] = rest / middle + (i < rest % middle ? 1 : 0);
  return counts;
}

Enumeration enumerate_plans(const SearchRequest& r) {
  check_request(r);
  Enumeration out;
  const spec::ModelSpec& m = r.model;
  const bool transformer = m.is_transformer();
  const int64_t layers = model_layers(m);
  // Every plan names its stack, so that a written plan predicts and runs the same way anywhere.
  out.stack = r.stack ? *r.stack
                      : spec::builtin_stack(spec::default_stack_name(r.cluster.device.kind ==
                                                                     spec::DeviceKind::kGpu));
  auto reject = [&](const std::string& reason) { out.rejected[reason] += 1; };
  for (int64_t tp : divisors(r.gpus)) {
    for (int64_t pp : divisors(r.gpus / tp)) {
      const int64_t dp = r.gpus / (tp * pp);
      ++out.considered;
      if (!transformer && tp > 1) {
        reject("tensor parallelism needs a transformer");
        continue;
      }
      if (transformer && !spec::tensor_parallel_problem(m, tp).empty()) {
        reject("tp does not divide the heads or the MLP");
        continue;
      }
      if (tp > r.cluster.devices_per_node && !r.allow_tp_across_nodes) {
        reject("tp larger than a node");
        continue;
      }
      if (pp > layers) {
        reject("more pipeline stages than layers");
        continue;
      }
      if (r.global_batch % dp != 0) {
        reject("global batch not divisible by dp");
        continue;
      }
      const int64_t per_replica = r.global_batch / dp;
      for (int64_t mb : divisors(per_replica)) {
        const int64_t micro_batches = per_replica / mb;
        if (!spec::micro_batch_count_problem(micro_batches).empty()) {
          reject("more micro-batches per step than the limit (spec/limits.hpp)");
          continue;
        }
        // Schedules and chunk counts.
        std::vector<std::pair<spec::Schedule, int64_t>> schedules;
        if (pp == 1) {
          schedules.push_back({spec::Schedule::k1F1B, 1});
        } else {
          schedules.push_back({spec::Schedule::kGpipe, 1});
          schedules.push_back({spec::Schedule::k1F1B, 1});
          for (int64_t v : divisors(layers / pp)) {
            if (v < 2 || layers % (pp * v) != 0) continue;
            if (micro_batches % pp != 0) {
              reject("interleaving needs micro-batches divisible by pp");
              continue;
            }
            schedules.push_back({spec::Schedule::kInterleaved, v});
          }
        }
        for (auto [schedule, v] : schedules) {
          for (int zero = 0; zero <= 3; ++zero) {
            if (zero >= 2 && pp > 1) {
              reject("ZeRO-2/3 with pipeline parallelism");
              continue;
            }
            if (zero >= 1 && dp == 1) continue;  // nothing to shard: the same plan as zero 0
            for (bool sp : {false, true}) {
              if (sp && tp == 1) continue;
              if (sp && transformer &&
                  !spec::sequence_parallel_problem(r.seq_len.value_or(m.transformer().seq_len), tp)
                       .empty()) {
                reject("sequence parallelism needs tp to divide the sequence");
                continue;
              }
              for (spec::Recompute rc :
                   {spec::Recompute::kNone, spec::Recompute::kSelective, spec::Recompute::kFull}) {
                if (rc == spec::Recompute::kSelective && !transformer) continue;
                std::vector<std::vector<int64_t>> splits = {{}};
                std::vector<int64_t> balanced = balanced_split(layers, pp * v);
                if (!balanced.empty()) splits.push_back(balanced);
                for (const std::vector<int64_t>& split : splits) {
                  spec::Plan p;
                  p.dp = dp;
                  p.tp = tp;
                  p.pp = pp;
                  p.zero = zero;
                  p.sequence_parallel = sp;
                  p.micro_batch = mb;
                  p.global_batch = r.global_batch;
                  p.schedule = schedule;
                  p.virtual_stages = v;
                  p.stage_layers = split;
                  p.recompute = rc;
                  p.dtype = r.dtype;
                  p.seq_len = r.seq_len;
                  p.model = m.name;
                  p.cluster = r.cluster.name;
                  bool allowed = true;
                  for (const Constraint& c : r.constraints) allowed = allowed && c.allows(p);
                  if (!allowed) {
                    reject("excluded by --constraint");
                    continue;
                  }
                  out.plans.push_back(std::move(p));
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace sextant::planner
