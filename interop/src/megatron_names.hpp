// The Megatron-Core settings that both of its front ends name: pretrain_gpt.py's flag and NeMo
// 2.0's recipe path (each recorded with its source line in stacks/flags/megatron.json and
// nemo.json). export_megatron.cpp writes them and import_megatron.cpp reads them: one table.
#pragma once

namespace sextant::interop::detail {

struct MegatronName {
  const char* flag;  // "" where pretrain_gpt.py has none
  const char* nemo;  // "" where NeMo's recipe has none
};

inline constexpr MegatronName kContextParallelSize{"--context-parallel-size",
                                                   "trainer.strategy.context_parallel_size"};
inline constexpr MegatronName kCpCommType{"--cp-comm-type", "model.config.cp_comm_type"};
inline constexpr MegatronName kDataParallelShardingStrategy{
    "--data-parallel-sharding-strategy", "trainer.strategy.ddp.data_parallel_sharding_strategy"};
inline constexpr MegatronName kDdpBucketSize{"--ddp-bucket-size",
                                             "trainer.strategy.ddp.bucket_size"};
inline constexpr MegatronName kDecoderFirstPipelineNumLayers{
    "--decoder-first-pipeline-num-layers", "trainer.strategy.num_layers_in_first_pipeline_stage"};
inline constexpr MegatronName kDecoderLastPipelineNumLayers{
    "--decoder-last-pipeline-num-layers", "trainer.strategy.num_layers_in_last_pipeline_stage"};
inline constexpr MegatronName kExpertModelParallelSize{
    "--expert-model-parallel-size", "trainer.strategy.expert_model_parallel_size"};
inline constexpr MegatronName kGlobalBatchSize{"--global-batch-size", "data.global_batch_size"};
inline constexpr MegatronName kMicroBatchSize{"--micro-batch-size", "data.micro_batch_size"};
inline constexpr MegatronName kNoOverlapP2pCommunication{"--no-overlap-p2p-communication",
                                                         "model.config.overlap_p2p_comm"};
inline constexpr MegatronName kOptimizerCpuOffload{"--optimizer-cpu-offload",
                                                   "optim.config.optimizer_cpu_offload"};
inline constexpr MegatronName kOverlapCpuOptimizerD2hH2d{
    "--overlap-cpu-optimizer-d2h-h2d", "optim.config.overlap_cpu_optimizer_d2h_h2d"};
inline constexpr MegatronName kOverlapGradReduce{"--overlap-grad-reduce",
                                                 "trainer.strategy.ddp.overlap_grad_reduce"};
inline constexpr MegatronName kOverlapParamGather{"--overlap-param-gather",
                                                  "trainer.strategy.ddp.overlap_param_gather"};
inline constexpr MegatronName kPipelineModelParallelSize{
    "--pipeline-model-parallel-size", "trainer.strategy.pipeline_model_parallel_size"};
inline constexpr MegatronName kRecomputeGranularity{"--recompute-granularity",
                                                    "model.config.recompute_granularity"};
inline constexpr MegatronName kRecomputeMethod{"--recompute-method",
                                               "model.config.recompute_method"};
inline constexpr MegatronName kRecomputeNumLayers{"--recompute-num-layers",
                                                  "model.config.recompute_num_layers"};
inline constexpr MegatronName kSeqLength{"--seq-length", "data.seq_length"};
inline constexpr MegatronName kSequenceParallel{"--sequence-parallel",
                                                "trainer.strategy.sequence_parallel"};
inline constexpr MegatronName kTensorModelParallelSize{
    "--tensor-model-parallel-size", "trainer.strategy.tensor_model_parallel_size"};
inline constexpr MegatronName kUseDistributedOptimizer{"--use-distributed-optimizer",
                                                       "optim.config.use_distributed_optimizer"};
inline constexpr MegatronName kUsePrecisionAwareOptimizer{
    "--use-precision-aware-optimizer", "optim.config.use_precision_aware_optimizer"};

}  // namespace sextant::interop::detail
