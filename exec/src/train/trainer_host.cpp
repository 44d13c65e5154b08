// The optimizer's states off the device: the host step (ZeRO-Offload), states and parameters in
// NVMe files (ZeRO-Infinity) and their reads and writes around it.
#include "trainer_loop.hpp"

namespace sextant::exec {

void Trainer::parameters_to_nvme() {
  std::vector<std::span<const float>> pieces;
  for (auto [b, e] : sync_->owned())
    pieces.emplace_back(host_values_.data() + b, static_cast<size_t>(e - b));
  param_file_->write(pieces);
}

void Trainer::fetch_from_nvme(int64_t b, int64_t e, Tensor& to) {
  int64_t offset = 0;
  for (auto [ob, oe] : sync_->owned()) {
    if (b >= ob && e <= oe) {
      Tensor staged = fetch_buffer_.rows(0, e - b);
      param_file_->read_at(offset + (b - ob), {staged.data(), static_cast<size_t>(e - b)});
      ctx_.backend->copy(staged, to);
      return;
    }
    offset += oe - ob;
  }
  throw std::logic_error(
      fmt::format("a parameter fetch of [{}, {}) outside the rank's owned ranges", b, e));
}

std::vector<std::span<float>> Trainer::nvme_pieces() {
  std::vector<std::span<float>> out;
  for (Tensor* t : {&host_values_, &m_, &v_})
    for (auto [b, e] : sync_->owned()) out.emplace_back(t->data() + b, static_cast<size_t>(e - b));
  return out;
}

void Trainer::poison_states() {
  const std::vector<std::span<float>> pieces = nvme_pieces();
  // ZeRO-Infinity's parameters on the host are the masters the layers fetch: they stay (on
  // NVMe the layers fetch from the parameters' file).
  const bool keep_values = plan_.offload.params == spec::OffloadTarget::kHost;
  const size_t per_array = pieces.size() / 3;
  for (size_t i = keep_values ? per_array : 0; i < pieces.size(); ++i)
    std::fill(pieces[i].begin(), pieces[i].end(), std::numeric_limits<float>::quiet_NaN());
}

void Trainer::host_update(int64_t step, float grad_scale, int64_t updated) {
  const std::vector<Backend::AdamwSpan> spans = owned_spans();
  {
    auto s = ctx_.recorder->scope(ctx_.offload(models::host_update(updated, kHostParamDtype),
                                               Phase::kOpt, std::nullopt, std::nullopt));
    // NVMe: the states read before the update and written back after it, within the step
    // (the simulator prices both transfers in offload.adamw).
    if (nvme_) states_from_nvme();
    ctx_.backend->adamw_spans(host_values_, host_grads_, m_, v_, spans, step, o_.lr, o_.beta1,
                              o_.beta2, o_.eps, grad_scale);
    if (nvme_) write_states();
  }
  update_parameters_from_host(updated);
  // The updated masters have reached the parameters: the file's copy is the only one now.
  if (nvme_) poison_states();
}

void Trainer::update_parameters_from_host(int64_t updated) {
  // ZeRO-Infinity: the updated masters stay on the host, where each layer's next fetch reads
  // them, or go to the parameters' file on NVMe, where it reads them then.
  const std::optional<models::StepOp> back =
      models::updated_parameters_return(plan_, updated, kHostParamDtype);
  if (!back) return;
  auto s = ctx_.recorder->scope(ctx_.offload(*back, Phase::kOpt, std::nullopt, std::nullopt));
  if (plan_.offload.params == spec::OffloadTarget::kNvme) {
    parameters_to_nvme();
    return;
  }
  for (auto [b, e] : sync_->owned()) {
    Tensor to = stage_->params().values().rows(b, e - b);
    ctx_.backend->copy(host_values_.rows(b, e - b), to);
  }
}

}  // namespace sextant::exec
