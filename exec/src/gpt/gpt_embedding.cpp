#include "gpt_embedding.hpp"

namespace sextant::exec {

using models::OpId;
using spec::Phase;

GptEmbedding::GptEmbedding(const GptParts& parts, ParamStore& store) : GptLayer(parts) {
  table_ = &store.get("embed.table");
  if (model().position_embedding == spec::PositionEmbedding::kLearned)
    position_table_ = &store.get("embed.position");
}

int64_t GptEmbedding::slice_begin() const {
  return shape().sequence_parallel ? shape().r * shape().local_rows : 0;
}

std::vector<std::tuple<int64_t, int64_t, int64_t>> GptEmbedding::position_runs() const {
  const GptShape& s = shape();
  if (parts_.cp != nullptr) return parts_.cp->position_runs(slice_begin(), s.local_rows);
  if (!pairs().splits_each_sequence()) return {{0, slice_begin(), s.local_rows}};
  // Each sequence's positions [r s/tp, (r+1) s/tp) (LinearPairs::split_each_sequence).
  std::vector<std::tuple<int64_t, int64_t, int64_t>> runs;
  const int64_t part = s.seq / s.t;
  for (int64_t b = 0; b < s.batch; ++b) runs.emplace_back(b * part, s.r * part, part);
  return runs;
}

Tensor GptEmbedding::forward(const MicroBatch& mb, const Tensor& /*x*/) {
  const GptShape& s = shape();
  Tensor e = act({s.rows, s.h});
  {
    auto scope = rec(ctx().op(OpId::kEmbedLookup, 0, Phase::kFwd, mb.index));
    backend().embedding(mb.tokens, table_->compute, s.r * s.vocab_local, e);
  }
  Tensor x = pairs().reduce_out(e, models::kEmbedCollectives, Phase::kFwd, 0, mb.index);
  if (position_table_ != nullptr) {
    auto scope = rec(ctx().op(OpId::kEmbedPosition, 0, Phase::kFwd, mb.index));
    for (auto [row, first, count] : position_runs()) {
      Tensor run = x.rows(row, count);
      backend().add_positions(position_table_->compute, first, s.seq, run);
    }
  }
  return x;
}

Tensor GptEmbedding::backward(const MicroBatch& mb, const Tensor& dy) {
  const GptShape& s = shape();
  if (position_table_ != nullptr) {
    auto scope = rec(ctx().op(OpId::kEmbedPosition, 0, Phase::kBwd, mb.index));
    for (auto [row, first, count] : position_runs())
      backend().add_positions_backward(dy.rows(row, count), first, s.seq, position_table_->grad);
  }
  Tensor full = pairs().reduce_out_backward(dy, models::kEmbedCollectives, 0, mb.index);
  auto scope = rec(ctx().op(OpId::kEmbedLookup, 0, Phase::kBwd, mb.index));
  backend().embedding_backward(mb.tokens, full, s.r * s.vocab_local, table_->grad);
  return Tensor();
}

}  // namespace sextant::exec
