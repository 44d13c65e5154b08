// The CUDA backend is a module of its own (libsextant_cuda.so), loaded with dlopen the first time
// a command asks for a GPU: cuBLASLt's static initialisers alone cost ~0.4 s of CPU and ~200 MB of
// memory at start-up, which every `sextant simulate` or `plan` paid while linked eagerly (issue
// 15). This is the module's whole interface: one C entry point returning a table of functions
// (cuda_module_loader.cpp is the other side). Both sides are built together from one tree, so the
// table may carry C++ types; kAbiVersion catches a module left over from another build.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "sextant/exec/backend.hpp"
#include "sextant/exec/communicators.hpp"
#include "sextant/exec/precision.hpp"

namespace sextant::exec::cuda_module {

inline constexpr int kAbiVersion = 1;

struct Table {
  int abi_version;
  int (*device_count)();
  std::string (*unavailable_reason)();
  std::unique_ptr<Backend> (*make_backend)(int device, Precision precision);
  std::unique_ptr<Communicator> (*make_communicator)(CommKind kind, MPI_Comm comm,
                                                     std::string name);
};

// The module's implementations (module-internal: the version script exports only the entry).
int device_count();
std::string unavailable_reason();
std::unique_ptr<Backend> make_backend(int device, Precision precision);
std::unique_ptr<Communicator> make_communicator(CommKind kind, MPI_Comm comm, std::string name);

}  // namespace sextant::exec::cuda_module

// The entry point the loader looks up by name.
extern "C" const sextant::exec::cuda_module::Table* sextant_cuda_module();
inline constexpr const char* kSextantCudaModuleEntry = "sextant_cuda_module";
