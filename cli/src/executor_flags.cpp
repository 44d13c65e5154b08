// Parsing of the executor flags.
#include "executor_flags.hpp"

#include "sextant/spec/error.hpp"

namespace sextant::cli {

void add_executor_flags(CLI::App& cmd, ExecutorFlags& flags, bool with_precision) {
  cmd.add_option("--backend", flags.backend,
                 "cpu (Eigen + MPI) or cuda (cuBLAS, own kernels, NCCL)");
  cmd.add_option(
      "--comm", flags.comm,
      "Collectives: auto (cpu: mpi; cuda: nccl when every rank has a GPU of its own, else "
      "mpi through host memory), mpi or nccl");
  if (with_precision)
    cmd.add_option(
        "--precision", flags.precision,
        "bf16: mixed precision (bf16 activations and weight copies, fp32 master weights, "
        "gradients and optimizer; cuda default; emulated on cpu), fp32 (cpu default), and on "
        "cuda tf32 or bf16-gemm (fp32 tensors, tensor-core GEMMs)");
}

exec::BackendKind backend_kind(const ExecutorFlags& flags) {
  if (flags.backend == "cpu" || flags.backend == "mpi") return exec::BackendKind::kCpu;
  if (flags.backend == "cuda" || flags.backend == "gpu") return exec::BackendKind::kCuda;
  throw InputError("command line", "--backend", flags.backend, "cpu or cuda");
}

std::optional<exec::CommKind> comm_choice(const ExecutorFlags& flags) {
  if (flags.comm == "auto") return std::nullopt;
  if (flags.comm == "mpi") return exec::CommKind::kMpi;
  if (flags.comm == "nccl") return exec::CommKind::kNccl;
  throw InputError("command line", "--comm", flags.comm, "auto, mpi or nccl");
}

std::optional<exec::Precision> precision_choice(const ExecutorFlags& flags) {
  for (exec::Precision p : {exec::Precision::kFp32, exec::Precision::kTf32,
                            exec::Precision::kBf16Gemm, exec::Precision::kBf16})
    if (flags.precision == exec::precision_name(p)) return p;
  if (flags.precision.empty()) return std::nullopt;
  throw InputError("command line", "--precision", flags.precision, "bf16, bf16-gemm, tf32 or fp32");
}

}  // namespace sextant::cli
