// What the executor refuses before it starts: plans it cannot run, said with the field at fault.
#include <gtest/gtest.h>

#include "sextant/exec/trainer.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {
namespace {

// The executor offloads the optimizer (ZeRO-Offload) to host memory or its states to NVMe (a file
// per rank, nvme_file.hpp) and, under ZeRO-3 beside it, the parameters (ZeRO-Infinity) to host
// memory or NVMe, and the activations of transformer blocks; parameters without the optimizer and
// activations of other models are refused naming the field.
TEST(ExecutorPlan, OffloadBeyondWhatTheHostPoolHoldsIsRefusedNamingTheField) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan;
  plan.dp = 2;
  plan.zero = 1;
  plan.micro_batch = 1;
  plan.global_batch = 2;
  plan.offload.optimizer = spec::OffloadTarget::kHost;
  EXPECT_NO_THROW(validate_for_executor(model, plan, 2));
  auto refused = [&](const spec::ModelSpec& m, const spec::Plan& p, const std::string& field,
                     const std::string& why) {
    try {
      validate_for_executor(m, p, 2);
      ADD_FAILURE() << "accepted: " << p.name();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  spec::Plan nvme = plan;
  nvme.offload.optimizer = spec::OffloadTarget::kNvme;
  EXPECT_NO_THROW(validate_for_executor(model, nvme, 2));
  spec::Plan z3 = plan;
  z3.zero = 3;
  z3.offload.params = spec::OffloadTarget::kHost;
  EXPECT_NO_THROW(validate_for_executor(model, z3, 2));
  z3.offload.params = spec::OffloadTarget::kNvme;
  EXPECT_NO_THROW(validate_for_executor(model, z3, 2));
  z3.offload.optimizer = spec::OffloadTarget::kNvme;
  EXPECT_NO_THROW(validate_for_executor(model, z3, 2));
  z3.offload.params = spec::OffloadTarget::kHost;
  EXPECT_NO_THROW(validate_for_executor(model, z3, 2));
  z3.offload.optimizer = spec::OffloadTarget::kNone;
  refused(model, z3, "/offload/params", "with the optimizer");
  z3.offload.params = spec::OffloadTarget::kNvme;
  refused(model, z3, "/offload/params", "\"nvme\"");
  spec::Plan activations = plan;
  activations.offload.activations = spec::OffloadTarget::kHost;
  EXPECT_NO_THROW(validate_for_executor(model, activations, 2));
  refused(models::zoo_model("mlp-small"), activations, "/offload/activations",
          "transformer blocks");
}

}  // namespace
}  // namespace sextant::exec
