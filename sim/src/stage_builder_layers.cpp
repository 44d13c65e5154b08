// A layer's ops of one pass as engine tasks: compute segments, tensor-parallel collectives and
// their overlap with the GEMMs beside them, a tensor grid's gathers and scatters.
#include "stage_builder.hpp"

namespace sextant::sim {

void StageBuilder::compute_op(size_t layer, const models::Op& op, Phase phase, int64_t mb) {
  if (!pending_ops_.empty() && (phase != pending_phase_ || mb != pending_micro_batch_)) flush();
  pending_phase_ = phase;
  pending_micro_batch_ = static_cast<int32_t>(mb);
  pending_ops_.push_back(op_id(layer, op, phase));
}

int32_t StageBuilder::comm(Stream stream, CommClass cls, uint8_t slot, TaskKind kind,
                           spec::CollectiveKind collective, int64_t bytes, int32_t op, Phase phase,
                           int64_t mb, int32_t after, int32_t also) {
  Task t;
  t.kind = kind;
  t.stream = stream;
  t.comm_class = cls;
  t.slot = slot;
  t.collective = collective;
  t.bytes = bytes;
  t.op_begin = op;
  t.phase = phase;
  t.micro_batch = static_cast<int32_t>(mb);
  std::vector<Dep> deps;
  if (after >= 0) deps.push_back(done(after));
  if (also >= 0) deps.push_back(done(also));
  return emit(t, deps);
}

int32_t StageBuilder::layer_collective(size_t layer, const models::Op& op, Phase phase,
                                       int64_t mb) {
  int32_t before = issue_point(phase, mb);
  const bool context = op.group == models::CommGroup::kContext;
  const bool expert = op.group == models::CommGroup::kExpert;
  const CommClass cls = context                                   ? CommClass::kCp
                        : expert                                  ? CommClass::kEp
                        : op.group == models::CommGroup::kSpatial ? CommClass::kSpatial
                        : op.group == models::CommGroup::kData    ? CommClass::kDp
                                                                  : CommClass::kTp;
  GroupSlot slot = GroupSlot::kTp;
  switch (op.group) {
    case models::CommGroup::kLayer:
      break;
    case models::CommGroup::kContext:
      slot = GroupSlot::kCp;
      break;
    case models::CommGroup::kExpert:
      slot = GroupSlot::kEp;
      break;
    case models::CommGroup::kGridX:
      slot = GroupSlot::kGridX;
      break;
    case models::CommGroup::kGridY:
      slot = GroupSlot::kGridY;
      break;
    case models::CommGroup::kGridZ:
      slot = GroupSlot::kGridZ;
      break;
    case models::CommGroup::kSpatial:
      slot = GroupSlot::kSpatial;
      break;
    case models::CommGroup::kFilterReduce:
      slot = GroupSlot::kFilterReduce;
      break;
    case models::CommGroup::kChannelGather:
      slot = GroupSlot::kChannelGather;
      break;
    case models::CommGroup::kData:
      slot = GroupSlot::kDpLayer;
      break;
  }
  // The z axis of a tensor grid on its own stream (AxoNN's depth group, spec::Stream).
  const Stream stream =
      op.group == models::CommGroup::kGridZ ? Stream::kDepthComm : Stream::kTpComm;
  return comm(stream, cls, static_cast<uint8_t>(slot), TaskKind::kCollective, op.collective,
              op.costed_bytes(), op_id(layer, op, phase), phase, mb, before);
}

void StageBuilder::ring_step(size_t layer, const models::Op& transfer, const models::Op& attention,
                             Phase phase, int64_t mb) {
  const int32_t task = layer_collective(layer, transfer, phase, mb);
  compute_op(layer, attention, phase, mb);
  require(task);
}

void StageBuilder::gathered_gemm(size_t layer, const models::Op& gather, const models::Op& gemm,
                                 Phase phase, int64_t mb) {
  const int64_t first = gather.bytes / tp_overlap_chunks(gather.collective, plan_.tp);
  int32_t before = issue_point(phase, mb);
  const int32_t l = static_cast<int32_t>(layer);
  int32_t head = comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
                      TaskKind::kCollective, gather.collective, first,
                      named_op(gather.name, gather.op_class, first, l), phase, mb, before);
  int32_t rest =
      comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
           TaskKind::kCollective, gather.collective, gather.bytes - first,
           named_op(gather.name, gather.op_class, gather.bytes - first, l), phase, mb, head);
  require(head);
  compute_op(layer, gemm, phase, mb);
  require(rest);
}

void StageBuilder::scattered_gemm(size_t layer, const models::Op& gemm, const models::Op& scatter,
                                  Phase phase, int64_t mb) {
  const int64_t last_bytes = scatter.bytes / tp_overlap_chunks(scatter.collective, plan_.tp);
  const int64_t early_bytes = scatter.bytes - last_bytes;
  const int32_t l = static_cast<int32_t>(layer);
  int32_t before = issue_point(phase, mb);
  comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp), TaskKind::kCollective,
       scatter.collective, early_bytes, named_op(scatter.name, scatter.op_class, early_bytes, l),
       phase, mb, before);
  compute_op(layer, gemm, phase, mb);
  int32_t gemm_task = flush();
  int32_t last =
      comm(Stream::kTpComm, CommClass::kTp, static_cast<uint8_t>(GroupSlot::kTp),
           TaskKind::kCollective, scatter.collective, last_bytes,
           named_op(scatter.name, scatter.op_class, last_bytes, l), phase, mb, gemm_task);
  require(last);
}

void StageBuilder::run_grid_ops(size_t layer, std::span<const models::Op> ops, Phase phase,
                                int64_t mb) {
  const GridOverlap grid = grid_overlap(plan_, stack_, is_block(layer));
  const bool forward = phase != Phase::kBwd && grid.forward;
  for_each_grid_step(ops, grid, phase, [&](GridStepKind kind, size_t i, size_t other) {
    const models::Op& op = ops[i];
    switch (kind) {
      case GridStepKind::kWeightGather: {
        if (!forward) {
          tp_collective(layer, op, phase, mb);
          break;
        }
        auto it = prefetched_.find(&op);
        int32_t task = -1;
        if (it != prefetched_.end()) {
          task = it->second;
          prefetched_.erase(it);
        } else {
          task = layer_collective(layer, op, phase, mb);
        }
        if (other < ops.size()) {
          prefetched_[&ops[other]] = layer_collective(layer, ops[other], phase, mb);
        } else if (phase == Phase::kFwd && layer + 1 < forward_end_ && is_block(layer + 1)) {
          prefetch_first_gather(layer + 1, mb);
        }
        require(task);
        break;
      }
      case GridStepKind::kWeightScatter:
        depth_scatter_ = layer_collective(layer, op, phase, mb);
        break;
      case GridStepKind::kSplitGemm: {
        const BackwardProducts& halves = backward_products(op);
        compute_op(layer, halves.dgrad, phase, mb);
        const int32_t reduced = layer_collective(layer, ops[other], phase, mb);
        compute_op(layer, halves.wgrad, phase, mb);
        require(reduced);
        break;
      }
      case GridStepKind::kCollective:
        tp_collective(layer, op, phase, mb);
        break;
      case GridStepKind::kCompute:
        compute_op(layer, op, phase, mb);
        break;
    }
  });
}

void StageBuilder::prefetch_first_gather(size_t layer, int64_t mb) {
  const std::vector<models::Op>& next = lowered_.layers[layer].forward;
  for (const models::Op& op : next)
    if (is_depth_gather(op)) {
      prefetched_[&op] = layer_collective(layer, op, Phase::kFwd, mb);
      return;
    }
}

void StageBuilder::run_ops(size_t layer, std::span<const models::Op> ops, Phase phase, int64_t mb) {
  const GridOverlap grid = grid_overlap(plan_, stack_, is_block(layer));
  if (grid.in(phase)) {
    run_grid_ops(layer, ops, phase, mb);
    return;
  }
  for_each_pass_step(ops, tp_overlapped(layer, phase), [&](PassStepKind kind, size_t i) {
    switch (kind) {
      case PassStepKind::kRingStep:
        ring_step(layer, ops[i], ops[i + 1], phase, mb);
        break;
      case PassStepKind::kGatheredGemm:
        gathered_gemm(layer, ops[i], ops[i + 1], phase, mb);
        break;
      case PassStepKind::kScatteredGemm:
        scattered_gemm(layer, ops[i], ops[i + 1], phase, mb);
        break;
      case PassStepKind::kCollective:
        tp_collective(layer, ops[i], phase, mb);
        break;
      case PassStepKind::kCompute:
        compute_op(layer, ops[i], phase, mb);
        break;
    }
  });
}

}  // namespace sextant::sim
