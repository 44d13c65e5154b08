// Per-stage memory from the lowering, the pipeline schedule and the software stack.
#include "sextant/sim/memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "sextant/models/gradient_compression.hpp"
#include "sextant/models/optimizer_step.hpp"
#include "sextant/sim/layer_cost.hpp"
#include "sextant/sim/offload_cost.hpp"
#include "sextant/sim/program_builder.hpp"
#include "sextant/spec/parameter_server.hpp"
#include "sextant/spec/pipeline_schedule.hpp"

namespace sextant::sim {

StateBytesPerParam state_bytes_per_param(spec::Dtype dtype, spec::Dtype grad) {
  const int64_t g = spec::dtype_bytes(grad);
  if (spec::dtype_bytes(dtype) >= 4) return {4, g, 8};
  return {spec::dtype_bytes(dtype), g, 12};
}

int64_t communicators_of_stage(const spec::Plan& plan, const models::LoweredModel& lowered,
                               int64_t stage) {
  int64_t n = 0;
  if (plan.tp > 1) ++n;              // the layer group
  if (lowered.stationary_w) n += 2;  // a channel split's reduce and gather groups
  if (plan.spatial.any()) ++n;       // the spatial group
  if (plan.replicas() > 1) ++n;
  if (plan.cp > 1) ++n;                                // the context-parallel group
  if (plan.ep > 1) ++n;                                // the expert-parallel group
  if (plan.ep > 1 && plan.expert_replicas() > 1) ++n;  // the expert-data-parallel group
  const spec::TensorGrid& grid = plan.tp_grid;         // the lines of a 3D tensor grid
  if (grid.any()) n += (grid.x > 1 ? 1 : 0) + (grid.y > 1 ? 1 : 0) + (grid.z > 1 ? 1 : 0);
  if (plan.pp > 1) ++n;  // the stage-to-stage send/receive channels
  const bool end_stage = stage == 0 || stage == plan.pp - 1;
  if (plan.pp > 1 && lowered.tied_table_params > 0 && end_stage) ++n;  // the embedding group
  return n;
}

StageFootprint stage_footprint(const spec::Plan& plan, const models::LoweredModel& lowered,
                               int64_t stage) {
  StageLayers layers = stage_layers(plan, lowered, stage);
  const size_t chunks = layers.chunk_begin.size();
  StageFootprint f;
  f.params = models::stage_params(plan, lowered, stage);
  f.expert_params = models::stage_expert_params(plan, lowered, stage);
  f.chunk_activation.assign(chunks, 0);
  f.chunk_offloaded.assign(chunks, 0);
  const std::vector<spec::Recompute> recompute = models::layer_recompute(plan, lowered);
  const std::vector<bool> offloaded = models::layer_activation_offload(plan, lowered);
  for (size_t v = 0; v < chunks; ++v) {
    for (size_t l = layers.chunk_begin[v]; l < layers.chunk_end[v]; ++l) {
      const models::Layer& layer = lowered.layers[l];
      f.replica_whole_params += layer.replica_whole_params;
      const int64_t kept = layer.saved_bytes_for(recompute[l]);
      f.largest_layer = std::max(f.largest_layer, layer.params);
      if (layer.kept_for_backward) {
        f.kept_params += layer.params;
      } else {
        f.largest_regathered = std::max(f.largest_regathered, layer.params);
      }
      if (offloaded[l]) {
        f.chunk_offloaded[v] += kept;
        f.largest_offloaded = std::max(f.largest_offloaded, kept);
      } else {
        f.chunk_activation[v] += kept;
      }
      // What a recomputed layer's backward brings back beside what it kept (nothing when the
      // policy drops nothing: selective recompute under a fused attention kernel).
      f.largest_working = std::max(f.largest_working, layer.saved_bytes - kept);
    }
  }
  for (const models::Layer& layer : lowered.layers)
    f.boundary = std::max(f.boundary, layer.output_bytes);
  return f;
}

spec::MemoryBreakdown stage_memory(const spec::Plan& plan, const spec::Stack& stack,
                                   const models::LoweredModel& lowered, int64_t stage,
                                   const spec::ClusterSpec* cluster,
                                   const spec::LiveProfile* profile, bool explain) {
  return stage_memory(plan, stack, lowered, stage, stage_footprint(plan, lowered, stage), cluster,
                      profile, explain);
}

namespace {

// 124,439,808
std::string count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// The activations a stage keeps per micro-batch, by run of layers of one kind keeping the same
// bytes ("block0-block31: 32 x ..."), and what is in flight at the peak.
void explain_activations(const spec::Plan& plan, const models::LoweredModel& lowered, int64_t stage,
                         const StageFootprint& f, const std::vector<int64_t>& peak_counts,
                         bool in_backward, std::vector<spec::MemoryItem>& out) {
  const StageLayers held = stage_layers(plan, lowered, stage);
  const std::vector<spec::Recompute> recompute = models::layer_recompute(plan, lowered);
  const std::vector<bool> offloaded = models::layer_activation_offload(plan, lowered);
  for (size_t v = 0; v < held.chunk_begin.size(); ++v) {
    const int64_t in_flight = v < peak_counts.size() ? peak_counts[v] : 0;
    std::string layers;
    for (size_t l = held.chunk_begin[v]; l < held.chunk_end[v];) {
      const models::Layer& first = lowered.layers[l];
      const int64_t kept = offloaded[l] ? 0 : first.saved_bytes_for(recompute[l]);
      size_t end = l + 1;
      while (end < held.chunk_end[v] && lowered.layers[end].kind == first.kind &&
             (offloaded[end] ? 0 : lowered.layers[end].saved_bytes_for(recompute[end])) == kept &&
             recompute[end] == recompute[l])
        ++end;
      const std::string mode(spec::enum_name(spec::recompute_names(), recompute[l]));
      const std::string range = end - l > 1 ? "-" + lowered.layers[end - 1].name : "";
      const std::string times = end - l > 1 ? fmt::format("{} x ", end - l) : "";
      layers += fmt::format("{}{}{}: {}{} B{}{}", layers.empty() ? "" : "; ", first.name, range,
                            times, count(kept), mode == "none" ? "" : " (recompute " + mode + ")",
                            offloaded[l] ? " (offloaded)" : "");
      l = end;
    }
    out.push_back({"activations", in_flight * f.chunk_activation[v],
                   fmt::format("{}{} B a micro-batch x {} in flight at the peak{}: {}",
                               held.chunk_begin.size() > 1 ? fmt::format("chunk {}: ", v) : "",
                               count(f.chunk_activation[v]), in_flight,
                               in_backward ? " (during a backward)" : "", layers)});
  }
}

}  // namespace

spec::MemoryBreakdown stage_memory(const spec::Plan& plan, const spec::Stack& stack,
                                   const models::LoweredModel& lowered, int64_t stage,
                                   const StageFootprint& footprint,
                                   const spec::ClusterSpec* cluster,
                                   const spec::LiveProfile* profile, bool explain) {
  std::vector<spec::MemoryItem> items;
  auto note = [&](const char* part, int64_t bytes, auto&& detail) {
    if (explain && bytes != 0) items.push_back({part, bytes, detail()});
  };
  const size_t chunks = footprint.chunk_activation.size();
  const int64_t params = footprint.params;
  const int64_t largest_layer = footprint.largest_layer;
  const int64_t largest_working = footprint.largest_working;
  const std::vector<int64_t>& chunk_activation = footprint.chunk_activation;

  StateBytesPerParam per = state_bytes_per_param(spec::parameter_dtype(stack, lowered.dtype),
                                                 spec::gradient_dtype(stack, lowered.dtype));
  const int64_t n = plan.replicas();
  // ZeRO shards the dense state over the replicas and the routed experts' over the expert
  // replicas (Megatron-LM's distributed optimizer over the expert-data-parallel group).
  const int64_t ne = plan.expert_replicas();
  const int64_t whole = footprint.replica_whole_params;
  const int64_t dense = params - footprint.expert_params - whole;
  const int64_t experts = footprint.expert_params;
  auto sharded = [&](int64_t bytes_per_param) {
    // (The whole stage as one span: the spans' padding, a few elements each, is not counted.)
    return models::zero_shard(dense * bytes_per_param, n) +
           models::zero_shard(experts * bytes_per_param, ne) + whole * bytes_per_param;
  };
  spec::MemoryBreakdown m;
  m.weights = params * per.weights;
  m.gradients = params * per.gradients;
  m.optimizer = params * per.optimizer;
  if (plan.zero >= 1) m.optimizer = sharded(per.optimizer);
  // A parameter server keeps the master weights and moments of its range (spec::server_shard).
  const bool servers = plan.parameter_server.enabled;
  if (servers) m.optimizer = spec::server_shard(params, plan.dp) * per.optimizer;
  if (plan.zero >= 2) m.gradients = sharded(per.gradients);
  if (plan.zero >= 3) m.weights = sharded(per.weights);
  // Offloaded state leaves the device (ZeRO-Offload: the optimizer shard and, from ZeRO-2 on,
  // each gradient shard as soon as its bucket is reduced; ZeRO-Infinity: the parameter shard).
  const bool offload_optimizer = plan.offload.optimizer != spec::OffloadTarget::kNone;
  if (offload_optimizer) m.optimizer = 0;
  if (offload_optimizer && plan.zero >= 2) m.gradients = 0;
  if (plan.offload.params != spec::OffloadTarget::kNone) m.weights = 0;
  // PipeDream-2BW stashes a second copy of the stage's weights for the batch in flight.
  // (Formatted only when asked: the planner calls this for every plan it estimates.)
  auto shard_note = [&](int zero) {
    if (servers && zero == 1) return fmt::format(", a 1/{} server range", plan.dp);
    return plan.zero >= zero ? fmt::format(", a 1/{} ZeRO shard", n) : std::string();
  };
  note("weights", m.weights, [&] {
    return fmt::format("{} parameters x {} B{}", count(params), per.weights, shard_note(3));
  });
  note("gradients", m.gradients, [&] {
    return fmt::format(
        "{} parameters x {} B ({}){}", count(params), per.gradients,
        spec::enum_name(spec::dtype_names(), spec::gradient_dtype(stack, lowered.dtype)),
        shard_note(2));
  });
  note("optimizer", m.optimizer, [&] {
    return fmt::format("{} parameters x {} B (fp32 master weights and Adam's two moments){}",
                       count(params), per.optimizer, shard_note(1));
  });
  if (plan.schedule == spec::Schedule::kPipeDream2BW) {
    const int64_t stash =
        params * models::weight_stash_bytes_per_param(spec::parameter_dtype(stack, lowered.dtype));
    m.weights += stash;
    note("weights", stash, [] { return std::string("PipeDream-2BW's stashed weight version"); });
  }
  if (servers && plan.parameter_server.staleness > 0) {
    // Stale workers double-buffer: the gradients pushed while the next step's backward writes
    // new ones, the version pulled while the step reads the older one.
    m.weights += params * per.weights;
    m.gradients += params * per.gradients;
    note("weights", params * per.weights,
         [] { return std::string("the version being pulled (a stale worker's second buffer)"); });
    note("gradients", params * per.gradients,
         [] { return std::string("the gradients being pushed (a stale worker's second buffer)"); });
  }
  if (plan.schedule == spec::Schedule::kPipeDream && stage + 1 < plan.pp) {
    // Stage s keeps pp - s versions, the newest the weights themselves (spec::pipedream_version).
    const int64_t versions = plan.pp - 1 - stage;
    const int64_t stash =
        versions * params *
        models::weight_stash_bytes_per_param(spec::parameter_dtype(stack, lowered.dtype));
    m.weights += stash;
    note("weights", stash, [&] {
      return fmt::format("PipeDream's {} stashed weight versions (stage {} of {})", versions, stage,
                         plan.pp);
    });
  }

  // Activations: the most the schedule keeps live (under recompute, plus the working set of the
  // layer whose backward runs).
  const spec::LiveProfile own =
      profile != nullptr ? spec::LiveProfile{}
                         : spec::live_profile(plan.schedule, plan.pp, spec::local_chunks(plan),
                                              plan.micro_batches(), stage);
  const spec::LiveProfile& moments = profile != nullptr ? *profile : own;
  auto bytes_at = [&](const std::vector<int64_t>& counts) {
    int64_t b = 0;
    for (size_t v = 0; v < chunks; ++v) b += counts[v] * chunk_activation[v];
    return b;
  };
  int64_t peak = 0;
  const std::vector<int64_t>* peak_counts = nullptr;
  bool peak_in_backward = false;
  for (const std::vector<int64_t>& counts : moments.after_forward) {
    const int64_t b = bytes_at(counts);
    if (peak_counts == nullptr || b > peak) peak_counts = &counts;
    peak = std::max(peak, b);
  }
  if (plan.recompute != spec::Recompute::kNone) {
    for (const std::vector<int64_t>& counts : moments.during_backward) {
      const int64_t b = bytes_at(counts) + largest_working;
      if (b > peak) {
        peak_counts = &counts;
        peak_in_backward = true;
      }
      peak = std::max(peak, b);
    }
  }
  if (explain && peak_counts != nullptr)
    explain_activations(plan, lowered, stage, footprint, *peak_counts, peak_in_backward, items);
  if (peak_in_backward)
    note("activations", largest_working,
         [] { return std::string("what the recomputed layer brings back for its backward"); });
  // Offloaded activations: on the host for every micro-batch in flight; on the device, two
  // layers' worth in transit (Transformer Engine's double buffer: a layer's copy to the host
  // finishes while the next computes, and in backward the next layer's reload while one runs), or
  // in backward the running layer's and the `prefetch_layers` reloaded ahead of it.
  int64_t offloaded_peak = 0;
  for (const std::vector<int64_t>& counts : moments.after_forward) {
    int64_t b = 0;
    for (size_t v = 0; v < chunks; ++v) b += counts[v] * footprint.chunk_offloaded[v];
    offloaded_peak = std::max(offloaded_peak, b);
  }
  if (offloaded_peak > 0) {
    const int64_t resident = 1 + std::max<int64_t>(1, plan.offload.prefetch_layers);
    peak += resident * footprint.largest_offloaded;
    note("activations", resident * footprint.largest_offloaded, [&] {
      return fmt::format("{} x {} B of offloaded layers in transit", resident,
                         count(footprint.largest_offloaded));
    });
  }
  m.activations = peak;

  // Buffers: stage-to-stage send and receive buffers, the DDP gradient bucket, and under ZeRO-3
  // the gathered parameters of the current and prefetched layers and its unsharded gradient.
  int64_t e = spec::dtype_bytes(lowered.dtype);
  int64_t buffers = plan.pp > 1 ? 2 * footprint.boundary : 0;
  note("buffers", buffers, [&] {
    return fmt::format("stage-to-stage send and receive, 2 x {} B", count(footprint.boundary));
  });
  if ((plan.replicas() > 1 || offload_optimizer) && plan.zero < 3) {
    const int64_t bucket = std::min(stack.dp_bucket_bytes, params * per.gradients);
    buffers += bucket;
    note("buffers", bucket, [] { return std::string("the gradient bucket being reduced"); });
  }
  // Compressed exchange: the error-feedback residual and the encodings of the stage's largest
  // bucket (a layer larger than the bucket size is a bucket of its own), as the executor holds.
  if (plan.compression.any() && plan.replicas() > 1) {
    const int64_t codec = models::compression_memory_bytes(
        plan.compression, params,
        models::gradient_buckets(plan, lowered, stage, stack.dp_bucket_bytes, per.gradients),
        plan.replicas(), per.gradients);
    buffers += codec;
    note("buffers", codec,
         [] { return std::string("gradient compression: error-feedback residual and encodings"); });
  }
  if ((plan.replicas() > 1 || plan.offload.params != spec::OffloadTarget::kNone) &&
      plan.zero == 3) {
    // At the backward's start the layers kept whole from the forward are all gathered, beside
    // the one being gathered again and those prefetched.
    const int64_t kept = footprint.kept_params;
    const int64_t regathered = footprint.largest_regathered;
    const int64_t gathered =
        (kept + (1 + stack.zero3_prefetch) * regathered) * e + largest_layer * per.gradients;
    buffers += gathered;
    note("buffers", gathered, [&] {
      return fmt::format(
          "sharded weights: {} parameters kept from forward to backward and {} gathered layer(s) "
          "of {} parameters, x {} B, and one unsharded gradient",
          count(kept), 1 + stack.zero3_prefetch, count(regathered), e);
    });
  }
  const int64_t before_grid = buffers;
  // A 3D tensor grid gathers one linear layer's weight block over z at a time and reduce-scatters
  // its whole gradient (models' grid_block): the stage's largest gather, and its gradient.
  if (plan.tp_grid.z > 1) {
    int64_t gathered = 0;
    const StageLayers held = stage_layers(plan, lowered, stage);
    for (size_t v = 0; v < held.chunk_begin.size(); ++v)
      for (size_t l = held.chunk_begin[v]; l < held.chunk_end[v]; ++l)
        for (const models::Op& op : lowered.layers[l].forward)
          if (op.group == models::CommGroup::kGridZ) gathered = std::max(gathered, op.bytes);
    buffers += gathered + gathered / e * per.gradients;
    // Under AxoNN's overlap (layer_cost.hpp grid_overlap) the next layer's block is gathered
    // while one is in use, and each weight gradient's reduced shard waits in a list until the
    // batch ends (overlap_communication.py accumulate_later: every micro-batch's, in the
    // compute dtype).
    const GridOverlap overlap = grid_overlap(plan, stack, /*block=*/true);
    if (overlap.forward) buffers += gathered;
    if (overlap.backward) {
      int64_t shard = 0;  // the rank's weight elements (without what the z slices hold alike)
      for (size_t v = 0; v < held.chunk_begin.size(); ++v)
        for (size_t l = held.chunk_begin[v]; l < held.chunk_end[v]; ++l)
          if (lowered.layers[l].kind == models::LayerKind::kBlock)
            shard += lowered.layers[l].params - lowered.layers[l].sp_partial_params;
      buffers += plan.micro_batches() * shard * e;
    }
  }
  note("buffers", buffers - before_grid,
       [] { return std::string("3D tensor grid: gathered weight blocks and their gradients"); });
  // Autocast keeps the 16-bit copy of every weight it cast from the forward to the backward.
  if (stack.autocast && spec::dtype_bytes(lowered.dtype) < 4) {
    buffers += params * e;
    note("buffers", params * e,
         [&] { return fmt::format("autocast's {}-byte weight copies, kept for the backward", e); });
  }
  m.buffers = buffers;

  // Beyond tensors: the caching allocator's reserve over what it hands out for activations and
  // transient buffers, and, given the cluster, the runtime and one buffer set per communicator.
  m.reserved = static_cast<int64_t>(
      std::llround(stack.allocator_reserve * static_cast<double>(m.activations + m.buffers)));
  note("reserved", m.reserved, [&] {
    return fmt::format("the caching allocator's reserve, {} of activations and buffers",
                       stack.allocator_reserve);
  });
  if (cluster != nullptr) {
    const int64_t communicators = communicators_of_stage(plan, lowered, stage);
    m.reserved += cluster->device.runtime_reserved_bytes +
                  communicators * cluster->network.communicator_buffer_bytes;
    note("reserved", cluster->device.runtime_reserved_bytes,
         [] { return std::string("runtime: CUDA context and library workspaces"); });
    note("reserved", communicators * cluster->network.communicator_buffer_bytes, [&] {
      return fmt::format("{} communicator{} x {} B of buffers", communicators,
                         communicators == 1 ? "" : "s",
                         count(cluster->network.communicator_buffer_bytes));
    });
  }
  m.explained = std::move(items);
  m.peak_bytes = m.weights + m.gradients + m.optimizer + m.activations + m.buffers + m.reserved;
  // Host memory of the offloaded shard (offload_cost.hpp), against the rank's share of its node's.
  const int64_t shard = (params + n - 1) / n;
  m.host_bytes = shard * host_bytes_per_param(plan.offload, per.weights) + offloaded_peak;
  if (cluster != nullptr) {
    m.capacity_bytes = cluster->device.memory_capacity_bytes;
    m.headroom_bytes = m.capacity_bytes - m.peak_bytes;
    m.fits = m.headroom_bytes >= 0;
    if (m.host_bytes > 0) {  // (a cluster without a host section holds none of it)
      m.host_capacity_bytes = host_capacity_per_rank(*cluster);
      m.fits = m.fits && m.host_bytes <= m.host_capacity_bytes;
    }
  }
  return m;
}

}  // namespace sextant::sim
