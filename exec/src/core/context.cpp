// Trace events with the lowering's figures.
#include "sextant/exec/context.hpp"

namespace sextant::exec {

Recorder::Event Context::op(const models::OpName& name, int32_t layer, spec::Phase phase,
                            int64_t micro_batch) const {
  Recorder::Event e;
  e.name = name.str();
  e.phase = phase;
  e.layer = layer;
  e.micro_batch = micro_batch;
  if (lowered != nullptr && layer >= 0 && static_cast<size_t>(layer) < lowered->layers.size()) {
    const models::Layer& l = lowered->layers[static_cast<size_t>(layer)];
    const std::vector<models::Op>& ops = phase == spec::Phase::kBwd ? l.backward : l.forward;
    bool found = false;
    for (const models::Op& o : ops) {
      if (o.id == name.id() && o.name == name.str() && !o.is_comm()) {
        e.op_class = o.op_class;
        e.flops = o.flops;
        e.bytes = o.bytes;
        e.shape = o.shape;
        found = true;
        break;
      }
    }
    // An op the lowering does not have would be traced without FLOPs or bytes, and the simulator
    // would never price it: the two readings of the plan would differ.
    SEXTANT_CHECK(found, "the executor's op {} ({} of layer {} \"{}\") is not in the lowering",
                  name.str(), spec::enum_name(spec::phase_names(), phase), layer, l.name);
  }
  return e;
}

Recorder::Event Context::offload(models::OpId id, spec::OpClass cls, int64_t bytes,
                                 spec::Phase phase, std::optional<int64_t> layer,
                                 std::optional<int64_t> micro_batch) const {
  Recorder::Event e;
  e.name = models::op_name(id);
  e.op_class = cls;
  e.stream = models::offload_stream(id);
  e.bytes = bytes;
  e.phase = phase;
  e.layer = layer;
  e.micro_batch = micro_batch;
  return e;
}

namespace {

// The algorithm a collective ran by: the plan's choice for its kind (the communicator runs it,
// exec/src/comm/p2p_collectives.hpp), else the library's ("mpi").
std::string algorithm_of(const spec::Plan* plan, spec::OpClass cls) {
  const std::optional<spec::CollectiveKind> kind = spec::collective_of(cls);
  if (plan != nullptr && kind)
    if (const auto it = plan->collective_algorithms.find(*kind);
        it != plan->collective_algorithms.end())
      return std::string(spec::enum_name(spec::collective_algorithm_names(), it->second));
  return "mpi";
}

}  // namespace

Recorder::Event Context::comm(const models::OpName& name, spec::OpClass cls, spec::Stream stream,
                              int64_t bytes, int64_t group_size, spec::Phase phase,
                              std::optional<int64_t> layer,
                              std::optional<int64_t> micro_batch) const {
  Recorder::Event e;
  e.name = name.str();
  e.op_class = cls;
  e.stream = stream;
  e.bytes = bytes;
  e.group_size = group_size;
  e.phase = phase;
  e.layer = layer;
  e.micro_batch = micro_batch;
  e.algorithm = algorithm_of(plan, cls);
  return e;
}

Recorder::Event Context::offload(const models::StepOp& op, spec::Phase phase,
                                 std::optional<int64_t> layer,
                                 std::optional<int64_t> micro_batch) const {
  return offload(op.id, op.op_class, op.bytes, phase, layer, micro_batch);
}

Recorder::Event Context::comm(const models::StepOp& op, int64_t group_size, spec::Phase phase,
                              std::optional<int64_t> layer,
                              std::optional<int64_t> micro_batch) const {
  return comm(op.id, op.op_class, op.stream, op.bytes, group_size, phase, layer, micro_batch);
}

}  // namespace sextant::exec
