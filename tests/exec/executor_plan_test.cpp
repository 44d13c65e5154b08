// What the executor refuses before it starts: plans it cannot run, said with the field at fault.
#include <gtest/gtest.h>

#include "sextant/exec/trainer.hpp"
#include "sextant/models/zoo.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {
namespace {

TEST(ExecutorPlan, OffloadIsRefusedNamingTheField) {
  const spec::ModelSpec model = models::zoo_model("gpt-tiny");
  spec::Plan plan;
  plan.dp = 2;
  plan.zero = 1;
  plan.micro_batch = 1;
  plan.global_batch = 2;
  EXPECT_NO_THROW(validate_for_executor(model, plan, 2));
  plan.offload.optimizer = spec::OffloadTarget::kHost;
  try {
    validate_for_executor(model, plan, 2);
    FAIL() << "an offloading plan was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/offload"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("simulated and planned only"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sextant::exec
