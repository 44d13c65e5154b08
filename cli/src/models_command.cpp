// `sextant models list|show`: the zoo and what a model costs (parameters, FLOPs, memory).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "fitted_output.hpp"
#include "format.hpp"
#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"
#include "validators.hpp"

namespace sextant::cli {

namespace {

struct ShowOptions {
  std::string model;
  bool json = false;
  int64_t micro_batch = 1;
  int64_t seq_len = 0;
};

std::string kind_summary(const spec::ModelSpec& m) {
  switch (m.kind()) {
    case spec::ModelKind::kTransformer: {
      const spec::TransformerSpec& t = m.transformer();
      return fmt::format(
          "{} transformer, {} layers, hidden {}, {} heads ({} kv), ffn {}, vocab {}, "
          "seq {}",
          spec::enum_name(spec::architecture_names(), t.architecture), t.layers, t.hidden, t.heads,
          t.kv_heads, t.ffn_hidden, t.vocab, t.seq_len);
    }
    case spec::ModelKind::kMlp:
      return fmt::format("MLP, widths [{}]", fmt::join(m.mlp().widths, ", "));
    case spec::ModelKind::kCnn:
      if (m.cnn().volumes())
        return fmt::format("CNN, {} layer entries, input {}x{}x{}x{} volumes",
                           m.cnn().layers.size(), m.cnn().in_channels, m.cnn().depth,
                           m.cnn().height, m.cnn().width);
      return fmt::format("CNN, {} layer entries, input {}x{}x{}", m.cnn().layers.size(),
                         m.cnn().in_channels, m.cnn().height, m.cnn().width);
  }
  return "";
}

void run_list() {
  fmt::print("{:<16} {:>10}  {}\n", "name", "params", "architecture");
  std::vector<std::string> names = models::zoo_names();
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    spec::ModelSpec m = models::zoo_model(name);
    fmt::print("{:<16} {:>10}  {}\n", name,
               human_count(static_cast<double>(models::parameter_count(m))),
               wrap_from(kind_summary(m), 29));
  }
}

void run_show(const ShowOptions& o) {
  spec::ModelSpec m = models::resolve_model(o.model);
  int64_t seq = o.seq_len > 0 ? o.seq_len : (m.is_transformer() ? m.transformer().seq_len : 1);
  int64_t params = models::parameter_count(m);
  double fwd_per_token = models::forward_flops_per_token(m, seq);
  models::StepFlops per_sample = models::step_flops(m, 1, seq, spec::Recompute::kNone);
  models::StepFlops per_sample_rc = models::step_flops(m, 1, seq, spec::Recompute::kFull);
  models::LoweredModel lowered =
      models::lower(m, models::LoweringOptions{o.micro_batch, seq, spec::Dtype::kBf16, 1, false});
  const models::Layer& layer = lowered.layers.at(lowered.split_begin);
  // Mixed-precision Adam: bf16 weights and gradients, fp32 master weights, momentum and variance
  // (2 + 2 + 12 = 16 bytes per parameter; Rajbhandari et al., ZeRO, §3.1).
  double state_bytes = 16.0 * static_cast<double>(params);
  const char* unit = m.is_transformer() ? "token" : "sample";
  if (o.json) {
    spec::Json j = {{"name", m.name},
                    {"kind", spec::enum_name(spec::model_kind_names(), m.kind())},
                    {"parameters", params},
                    {"active_parameters", models::active_parameter_count(m)},
                    {"seq_len", seq},
                    {"forward_flops_per_token", fwd_per_token},
                    {"training_flops_per_sequence", per_sample.model},
                    {"training_flops_per_sequence_full_recompute", per_sample_rc.hardware},
                    {"layers", lowered.layers.size()},
                    {"micro_batch", o.micro_batch},
                    {"activation_bytes_per_layer",
                     {{"none", layer.saved_bytes},
                      {"selective", layer.saved_bytes_selective},
                      {"full", layer.saved_bytes_full}}},
                    {"training_state_bytes", state_bytes},
                    {"model", spec::to_json(m)}};
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("{}: {}\n", m.name, m.description);
  fmt::print("  {}\n", kind_summary(m));
  if (!m.source.empty()) fmt::print("  source: {}\n", m.source);
  fmt::print("  parameters:             {} ({})\n", human_count(static_cast<double>(params)),
             params);
  if (const int64_t active = models::active_parameter_count(m); active != params)
    fmt::print("  active per token:       {} ({}; mixture of experts)\n",
               human_count(static_cast<double>(active)), active);
  fmt::print("  forward FLOPs per {}:   {}\n", unit, human_flops(fwd_per_token));
  fmt::print(
      "  training FLOPs per {}:  {} (with full recompute: {})\n", unit,
      human_flops(per_sample.model / static_cast<double>(lowered.tokens_per_micro_batch) *
                  static_cast<double>(o.micro_batch)),
      human_flops(per_sample_rc.hardware / static_cast<double>(lowered.tokens_per_micro_batch) *
                  static_cast<double>(o.micro_batch)));
  fmt::print("  weights+grads+Adam:     {} (16 bytes per parameter, mixed precision)\n",
             human_bytes(state_bytes));
  fmt::print("  activations per layer ({} {}, bf16, no tensor parallelism):\n", o.micro_batch,
             m.is_transformer() ? fmt::format("x {} tokens", seq) : std::string("samples"));
  fmt::print("    no recompute {}, selective {}, full {}\n",
             human_bytes(static_cast<double>(layer.saved_bytes)),
             human_bytes(static_cast<double>(layer.saved_bytes_selective)),
             human_bytes(static_cast<double>(layer.saved_bytes_full)));
}

}  // namespace

void add_models_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("models", "List the model zoo or show one model");
  cmd->require_subcommand(1);
  CLI::App* list = cmd->add_subcommand("list", "List the zoo models with their sizes");
  list->callback([] { run_list(); });
  auto show_opts = std::make_shared<ShowOptions>();
  CLI::App* show = cmd->add_subcommand("show", "Parameters, FLOPs and memory of a model");
  show->add_option("model", show_opts->model, "Zoo name, model file or Hugging Face config.json")
      ->required();
  show->add_flag("--json", show_opts->json, "Print JSON");
  show->add_option("--micro-batch", show_opts->micro_batch,
                   "Sequences per micro-batch for the "
                   "activation figures")
      ->check(positive());
  show->add_option("--seq-len", show_opts->seq_len, "Override the sequence length")
      ->check(positive());
  show->callback([show_opts] { run_show(*show_opts); });
}

}  // namespace sextant::cli
