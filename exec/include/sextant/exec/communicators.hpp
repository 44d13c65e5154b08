// Which communicator carries a job's collectives, and the factory that wraps an MPI group in it.
// mpi: host buffers, MPI (the CPU backend). mpi-staged: device buffers copied through host memory
// to MPI (the cuda backend with several ranks on one GPU, which NCCL refuses). nccl: device
// buffers, NCCL collectives bootstrapped over MPI (one GPU per rank).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "sextant/exec/communicator.hpp"
#include "sextant/spec/collective_kinds.hpp"

namespace sextant::exec {

enum class CommKind { kMpi, kMpiStaged, kNccl };

std::string_view comm_kind_name(CommKind kind);

// This rank's index among the ranks of its node (shared memory), and their number: the GPU a
// rank drives is its local index modulo the node's GPUs.
std::pair<int, int> node_local_rank(MPI_Comm world);

// Takes ownership of `comm` (unless it is MPI_COMM_WORLD or MPI_COMM_SELF). Collective over
// `comm`. The device kinds throw std::runtime_error in a build without CUDA. `algorithms`: the
// collectives the mpi kind runs by the named algorithm (exec/src/comm/p2p_collectives.hpp) rather
// than MPI's choice; the device kinds take none (spec::executor_problems refuses them there).
std::unique_ptr<Communicator> make_communicator(CommKind kind, MPI_Comm comm, std::string name,
                                                const spec::CollectiveAlgorithms& algorithms = {});

// The device kinds, implemented beside the CUDA backend (or refusing, without it).
std::unique_ptr<Communicator> make_device_communicator(CommKind kind, MPI_Comm comm,
                                                       std::string name);

}  // namespace sextant::exec
