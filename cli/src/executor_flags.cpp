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
        "cuda GEMMs: bf16 (tensor cores, fp32 accumulate), tf32 or fp32; tensors stay fp32");
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

exec::GemmPrecision gemm_precision(const ExecutorFlags& flags) {
  if (flags.precision == "bf16") return exec::GemmPrecision::kBf16;
  if (flags.precision == "tf32") return exec::GemmPrecision::kTf32;
  if (flags.precision == "fp32") return exec::GemmPrecision::kFp32;
  throw InputError("command line", "--precision", flags.precision, "bf16, tf32 or fp32");
}

}  // namespace sextant::cli
