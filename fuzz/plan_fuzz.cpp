// Plan files (sextant.plan/1, with an inline stack), then the checks against a model that every
// command runs next, and the names and stage splits derived from a plan.
#include "fuzz_support.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/json_io.hpp"
#include "sextant/spec/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = sextant::spec;
  static const spec::ModelSpec model = sextant::models::zoo_model("gpt-tiny");
  return sextant::fuzz::expect_clear_error(data, size, [](std::string_view text) {
    const spec::Plan plan =
        spec::plan_from_json(spec::parse_json_text(text, "fuzz.json"), "fuzz.json");
    (void)plan.name();
    (void)spec::to_json(plan);
    spec::validate_plan(plan, model, plan.world_size(), "fuzz.json");
    (void)spec::stage_layer_counts(plan, model.transformer().layers);
  });
}
