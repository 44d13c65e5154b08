// The communicator factory.
#include "sextant/exec/communicators.hpp"

#include "mpi_communicator.hpp"
#include "sextant/spec/error.hpp"

namespace sextant::exec {

void Communicator::all_gather_v_in_place(float*, const std::vector<int64_t>&) {
  SEXTANT_CHECK(false, "the {} communicator has no in-place gather of uneven blocks", name());
}

std::string_view comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::kMpi:
      return "mpi";
    case CommKind::kMpiStaged:
      return "mpi-staged";
    case CommKind::kNccl:
      return "nccl";
  }
  return "mpi";
}

std::pair<int, int> node_local_rank(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(node, &rank));
  MPI_CHECK(MPI_Comm_size(node, &size));
  MPI_Comm_free(&node);
  return {rank, size};
}

std::unique_ptr<Communicator> make_communicator(CommKind kind, MPI_Comm comm, std::string name,
                                                const spec::CollectiveAlgorithms& algorithms) {
  if (kind == CommKind::kMpi)
    return std::make_unique<MpiCommunicator>(comm, std::move(name), algorithms);
  SEXTANT_CHECK(algorithms.empty(), "the {} communicator runs its library's own algorithms",
                comm_kind_name(kind));
  return make_device_communicator(kind, comm, std::move(name));
}

}  // namespace sextant::exec
