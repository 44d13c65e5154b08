// Co-located parameter servers' messages (parameter_servers.hpp).
#include "parameter_servers.hpp"

#include <algorithm>

#include "sextant/models/parameter_server.hpp"
#include "sextant/spec/error.hpp"
#include "sextant/spec/parameter_server.hpp"

namespace sextant::exec {

namespace {

constexpr int kPsPushTag = 0x5d00;
constexpr int kPsPullTag = 0x5d01;
// Parameter gradients and (on CPU ranks in fp32, the table's rule) the values: 4 bytes each.
constexpr int64_t kPsElementBytes = 4;

}  // namespace

ParameterServers::ParameterServers(Context& ctx, ParamStore& store)
    : ctx_(ctx), store_(store), replicas_(*ctx.groups->replicas) {
  servers_ = replicas_.size();
  me_ = replicas_.rank();
  range_ = spec::server_range(store_.total(), servers_, me_);
}

ParameterServers::~ParameterServers() {
  // Every send is matched by the time training ends (the trainer pulls the last version).
  finish(pushed_, 0);
  finish(published_, 0);
}

int64_t ParameterServers::shard() const {
  return spec::server_shard(store_.total(), servers_);
}

void ParameterServers::finish(std::deque<Outgoing>& sent, size_t keep) {
  while (sent.size() > keep) {
    for (auto& request : sent.front().sends) request->wait();
    sent.pop_front();
  }
}

void ParameterServers::push() {
  const int64_t n = store_.total();
  auto s = ctx_.recorder->scope(ctx_.comm(models::ps_push(n, kPsElementBytes), servers_,
                                          spec::Phase::kOpt, std::nullopt, std::nullopt));
  const float* grads = store_.grads().data();
  Outgoing& out = pushed_.emplace_back();
  out.data.assign(grads, grads + n);
  for (int64_t server = 0; server < servers_; ++server) {
    if (server == me_) continue;
    const auto [b, e] = spec::server_range(n, servers_, server);
    out.sends.push_back(
        replicas_.send(out.data.data() + b, e - b, static_cast<int>(server), kPsPushTag));
  }
}

void ParameterServers::sum() {
  SEXTANT_CHECK(!pushed_.empty(), "a parameter server summing with no step pushed");
  const models::StepOp op = models::ps_sum(store_.total(), servers_, kPsElementBytes);
  auto s = ctx_.recorder->scope(Recorder::Event{models::op_name(op.id),
                                                op.op_class,
                                                op.stream,
                                                spec::Phase::kOpt,
                                                std::nullopt,
                                                std::nullopt,
                                                0,
                                                op.bytes,
                                                {},
                                                0,
                                                ""});
  const auto [b, e] = range_;
  const std::vector<float>& mine = pushed_.front().data;
  float* into = store_.grads().data() + b;
  part_.resize(static_cast<size_t>(e - b));
  // Worker 0's part, then each next worker's added: one order on every run.
  for (int64_t worker = 0; worker < servers_; ++worker) {
    const float* part = mine.data() + b;
    if (worker != me_) {
      replicas_.recv(part_.data(), e - b, static_cast<int>(worker), kPsPushTag);
      part = part_.data();
    }
    if (worker == 0) {
      std::copy(part, part + (e - b), into);
    } else {
      for (int64_t i = 0; i < e - b; ++i) into[i] += part[i];
    }
  }
  // This rank's own copy is spent; the others' sends of it complete as their servers sum.
  finish(pushed_, pushed_.size() - 1);
}

void ParameterServers::publish(const Tensor& masters) {
  const auto [b, e] = range_;
  Outgoing& out = published_.emplace_back();
  out.data.assign(masters.data() + b, masters.data() + e);
  for (int64_t worker = 0; worker < servers_; ++worker) {
    if (worker == me_) continue;
    out.sends.push_back(
        replicas_.send(out.data.data(), e - b, static_cast<int>(worker), kPsPullTag));
  }
}

void ParameterServers::pull() {
  SEXTANT_CHECK(!published_.empty(), "a worker pulling a version its server has not published");
  const int64_t n = store_.total();
  {
    auto s = ctx_.recorder->scope(ctx_.comm(models::ps_pull(n, kPsElementBytes), servers_,
                                            spec::Phase::kOpt, std::nullopt, std::nullopt));
    float* values = store_.values().data();
    for (int64_t server = 0; server < servers_; ++server) {
      const auto [b, e] = spec::server_range(n, servers_, server);
      if (server == me_) {
        const std::vector<float>& own = published_.front().data;
        std::copy(own.begin(), own.end(), values + b);
      } else {
        replicas_.recv(values + b, e - b, static_cast<int>(server), kPsPullTag);
      }
    }
  }
  store_.refresh_compute();
  finish(published_, published_.size() - 1);
}

}  // namespace sextant::exec
