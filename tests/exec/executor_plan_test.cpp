// What the executor refuses before it starts: plans it cannot run, said with the field at fault.
#include <gtest/gtest.h>

#include "sextant/exec/trainer.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {
namespace {

// The executor offloads the optimizer to host memory under ZeRO-1/2 (ZeRO-Offload); NVMe, ZeRO-3
// and the parameters' offload (ZeRO-Infinity) are refused naming the field.
TEST(ExecutorPlan, OffloadBeyondTheOptimizerOnTheHostIsRefusedNamingTheField) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan;
  plan.dp = 2;
  plan.zero = 1;
  plan.micro_batch = 1;
  plan.global_batch = 2;
  plan.offload.optimizer = spec::OffloadTarget::kHost;
  EXPECT_NO_THROW(validate_for_executor(model, plan, 2));
  auto refused = [&](const spec::Plan& p, const std::string& field, const std::string& why) {
    try {
      validate_for_executor(model, p, 2);
      ADD_FAILURE() << "accepted: " << p.name();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  spec::Plan nvme = plan;
  nvme.offload.optimizer = spec::OffloadTarget::kNvme;
  refused(nvme, "/offload/optimizer", "host memory only");
  spec::Plan z3 = plan;
  z3.zero = 3;
  refused(z3, "/offload/optimizer", "under ZeRO-1/2");
  z3.offload.params = spec::OffloadTarget::kHost;
  refused(z3, "/offload/params", "simulated and planned only");
}

}  // namespace
}  // namespace sextant::exec
