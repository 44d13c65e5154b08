// The rules of expert parallelism.
#include "sextant/spec/expert_parallel.hpp"

#include <fmt/format.h>

namespace sextant::spec {

std::string expert_parallel_problem(const Plan& plan) {
  const int64_t ep = plan.ep;
  if (ep <= 1) return "";
  if (plan.dp % ep != 0)
    return fmt::format(
        "must divide dp ({}): the ranks splitting the experts are data-parallel ranks "
        "(Megatron-LM's expert-model-parallel group is carved out of dp)",
        plan.dp);
  if (plan.offload.state()) return "runs without optimizer or parameter offload";
  return "";
}

std::string expert_model_problem(const ModelSpec& model, int64_t ep) {
  if (ep <= 1) return "";
  if (!model.is_transformer() || !model.transformer().moe)
    return "splits the routed experts of a mixture-of-experts model (a \"moe\" object): use "
           "ep = 1 for dense models";
  const int64_t experts = model.transformer().moe->experts;
  if (experts % ep != 0)
    return fmt::format(
        "must divide the model's {} routed experts (each rank holds experts/ep "
        "of them whole)",
        experts);
  return "";
}

std::string moe_tensor_parallel_problem(const ModelSpec& model, int64_t tp,
                                        bool sequence_parallel) {
  if (tp <= 1 || sequence_parallel || !model.is_transformer() || !model.transformer().moe)
    return "";
  return fmt::format(
      "a mixture of experts with tp {} needs sequence parallelism (as Megatron-LM asks): each tp "
      "rank routes its own tokens",
      tp);
}

}  // namespace sextant::spec
