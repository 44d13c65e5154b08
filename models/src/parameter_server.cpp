// The parameter servers' step ops (parameter_server.hpp).
#include "sextant/models/parameter_server.hpp"

#include "sextant/spec/parameter_server.hpp"

namespace sextant::models {

using spec::CollectiveKind;
using spec::OpClass;
using spec::Stream;

StepOp ps_push(int64_t params, int64_t grad_bytes) {
  return {OpId::kDpPsPush,      OpClass::kAllToAll, CollectiveKind::kAllToAll,
          StepGroup::kReplicas, Stream::kDpComm,    params,
          params * grad_bytes};
}

StepOp ps_sum(int64_t params, int64_t servers, int64_t grad_bytes) {
  const int64_t shard = spec::server_shard(params, servers);
  return {OpId::kDpPsSum,
          OpClass::kElementwise,
          std::nullopt,
          StepGroup::kLocal,
          Stream::kDpComm,
          shard,
          (servers + 1) * shard * grad_bytes};
}

StepOp ps_update(const OptimizerPrecision& precision, int64_t params, int64_t servers) {
  StepOp op = optimizer_update(precision, spec::server_shard(params, servers));
  op.stream = Stream::kDpComm;
  return op;
}

StepOp ps_pull(int64_t params, int64_t param_bytes) {
  return {OpId::kDpPsPull,      OpClass::kAllGather, CollectiveKind::kAllGather,
          StepGroup::kReplicas, Stream::kDpComm,     params,
          params * param_bytes};
}

}  // namespace sextant::models
