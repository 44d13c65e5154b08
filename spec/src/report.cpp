// Report JSON encoding and decoding.
#include "sextant/spec/report.hpp"

#include <fmt/format.h>

namespace sextant::spec {

Json to_json(const Report& r) {
  const TimeBreakdown& b = r.breakdown_s;
  const MemoryBreakdown& m = r.memory;
  Json j{{"schema", kReportSchema},
         {"model", r.model},
         {"cluster", r.cluster},
         {"plan", r.plan},
         {"gpus", r.gpus},
         {"network", r.network},
         {"stack", r.stack},
         {"step_time_s", r.step_time_s},
         {"tokens_per_s", r.tokens_per_s},
         {"samples_per_s", r.samples_per_s},
         {"mfu", r.mfu},
         {"hfu", r.hfu},
         {"model_tflops_per_gpu", r.model_tflops_per_gpu},
         {"hardware_tflops_per_gpu", r.hardware_tflops_per_gpu},
         {"breakdown_s",
          {{"compute", b.compute},
           {"tp_comm_exposed", b.tp_comm_exposed},
           {"dp_comm_exposed", b.dp_comm_exposed},
           {"pp_comm_exposed", b.pp_comm_exposed},
           {"fsdp_comm_exposed", b.fsdp_comm_exposed},
           {"spatial_comm_exposed", b.spatial_comm_exposed},
           {"cp_comm_exposed", b.cp_comm_exposed},
           {"ep_comm_exposed", b.ep_comm_exposed},
           {"bubble", b.bubble},
           {"optimizer", b.optimizer},
           {"offload_exposed", b.offload_exposed},
           {"host_bound", b.host_bound}}},
         {"memory",
          {{"peak_bytes", m.peak_bytes},
           {"capacity_bytes", m.capacity_bytes},
           {"fits", m.fits},
           {"weights", m.weights},
           {"gradients", m.gradients},
           {"optimizer", m.optimizer},
           {"activations", m.activations},
           {"buffers", m.buffers},
           {"reserved", m.reserved},
           {"headroom_bytes", m.headroom_bytes},
           {"host_bytes", m.host_bytes},
           {"host_capacity_bytes", m.host_capacity_bytes}}},
         {"events", r.events},
         {"simulated_ranks", r.simulated_ranks},
         {"sim_wall_s", r.sim_wall_s}};
  if (!m.explained.empty()) {
    Json items = Json::array();
    for (const MemoryItem& i : m.explained)
      items.push_back({{"part", i.part}, {"bytes", i.bytes}, {"detail", i.detail}});
    j["memory"]["explained"] = items;
  }
  return j;
}

Report report_from_json(const Json& json, const std::string& source) {
  Diagnostics diag(source);
  ObjectReader r(json, "", diag);
  if (!r.is_object()) diag.throw_if_any();
  Report out;
  r.expect_schema(kReportSchema);
  out.model = r.string("model").value_or("");
  out.cluster = r.string("cluster").value_or("");
  out.plan = r.string("plan").value_or("");
  out.gpus = r.integer("gpus", Range::at_least(1)).value_or(1);
  out.network = r.string("network").value_or("");
  out.stack = r.string("stack", Presence::kOptional).value_or("");
  const Range nn = Range::non_negative();
  out.step_time_s = r.number("step_time_s", nn).value_or(0);
  out.tokens_per_s = r.number("tokens_per_s", nn).value_or(0);
  out.samples_per_s = r.number("samples_per_s", nn).value_or(0);
  out.mfu = r.number("mfu", nn).value_or(0);
  out.hfu = r.number("hfu", nn).value_or(0);
  out.model_tflops_per_gpu = r.number("model_tflops_per_gpu", nn).value_or(0);
  out.hardware_tflops_per_gpu = r.number("hardware_tflops_per_gpu", nn).value_or(0);
  if (auto b = r.object("breakdown_s")) {
    TimeBreakdown& t = out.breakdown_s;
    t.compute = b->number("compute", nn).value_or(0);
    t.tp_comm_exposed = b->number("tp_comm_exposed", nn).value_or(0);
    t.dp_comm_exposed = b->number("dp_comm_exposed", nn).value_or(0);
    t.pp_comm_exposed = b->number("pp_comm_exposed", nn).value_or(0);
    t.fsdp_comm_exposed = b->number("fsdp_comm_exposed", nn).value_or(0);
    t.spatial_comm_exposed = b->number("spatial_comm_exposed", nn, Presence::kOptional).value_or(0);
    t.cp_comm_exposed = b->number("cp_comm_exposed", nn, Presence::kOptional).value_or(0);
    t.ep_comm_exposed = b->number("ep_comm_exposed", nn, Presence::kOptional).value_or(0);
    t.bubble = b->number("bubble", nn).value_or(0);
    t.optimizer = b->number("optimizer", nn).value_or(0);
    t.offload_exposed = b->number("offload_exposed", nn, Presence::kOptional).value_or(0);
    t.host_bound = b->number("host_bound", nn, Presence::kOptional).value_or(0);
    b->finish();
  }
  if (auto m = r.object("memory")) {
    MemoryBreakdown& mb = out.memory;
    mb.peak_bytes = m->integer("peak_bytes", nn).value_or(0);
    mb.capacity_bytes = m->integer("capacity_bytes", nn).value_or(0);
    mb.fits = m->boolean("fits").value_or(false);
    mb.weights = m->integer("weights", nn).value_or(0);
    mb.gradients = m->integer("gradients", nn).value_or(0);
    mb.optimizer = m->integer("optimizer", nn).value_or(0);
    mb.activations = m->integer("activations", nn).value_or(0);
    mb.buffers = m->integer("buffers", nn).value_or(0);
    mb.reserved = m->integer("reserved", nn, Presence::kOptional).value_or(0);
    // Derived, so it must agree with what it is derived from (it is negative when it does not fit).
    mb.headroom_bytes = m->integer("headroom_bytes", Range::any(), Presence::kOptional)
                            .value_or(mb.capacity_bytes - mb.peak_bytes);
    if (mb.headroom_bytes != mb.capacity_bytes - mb.peak_bytes)
      m->problem("headroom_bytes", std::to_string(mb.headroom_bytes),
                 fmt::format("must equal capacity_bytes - peak_bytes ({})",
                             mb.capacity_bytes - mb.peak_bytes));
    mb.host_bytes = m->integer("host_bytes", nn, Presence::kOptional).value_or(0);
    mb.host_capacity_bytes = m->integer("host_capacity_bytes", nn, Presence::kOptional).value_or(0);
    if (const Json* items = m->array("explained", Presence::kOptional)) {
      const std::string base = pointer_join(m->pointer(), "explained");
      for (size_t i = 0; i < items->size(); ++i) {
        ObjectReader item = element_reader(*items, base, i, diag);
        MemoryItem mi;
        mi.part = item.string("part").value_or("");
        mi.bytes = item.integer("bytes", nn).value_or(0);
        mi.detail = item.string("detail").value_or("");
        item.finish();
        mb.explained.push_back(std::move(mi));
      }
    }
    m->finish();
  }
  out.events = r.integer("events", nn).value_or(0);
  out.simulated_ranks =
      r.integer("simulated_ranks", Range::non_negative(), Presence::kOptional).value_or(out.gpus);
  out.sim_wall_s = r.number("sim_wall_s", nn).value_or(0);
  r.finish();
  diag.throw_if_any();
  return out;
}

}  // namespace sextant::spec
