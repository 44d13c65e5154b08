// The executor's CUDA entry points in a build with the CUDA backend: they load the backend's module
// (libsextant_cuda.so, cuda/cuda_module.hpp says why it is separate) on first use and call it.
// Where the module is looked for, in order: $SEXTANT_CUDA_MODULE (a path to the file), beside the
// running executable, in ../lib from it, and where this build tree put it. A module that cannot be
// loaded makes the GPU unavailable with the loader's reason, as a machine without a driver does.
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_module.hpp"
#include "sextant/exec/communicators.hpp"
#include "sextant/exec/cuda_backend.hpp"

namespace sextant::exec {

namespace {

constexpr const char* kModuleFile = "libsextant_cuda.so";

std::vector<std::string> module_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("SEXTANT_CUDA_MODULE"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
    return paths;  // an explicit choice is not second-guessed
  }
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back((exe.parent_path() / kModuleFile).string());
    // The build tree's layout (build/<preset>/{cli,tests,bench}/ and build/<preset>/lib/), which
    // survives copying the whole build directory elsewhere (e.g. to a GPU machine).
    paths.push_back((exe.parent_path().parent_path() / "lib" / kModuleFile).string());
  }
#ifdef SEXTANT_CUDA_MODULE_PATH
  paths.emplace_back(SEXTANT_CUDA_MODULE_PATH);
#endif
  return paths;
}

struct Loaded {
  const cuda_module::Table* table = nullptr;
  std::string error;  // why table is null
};

const Loaded& loaded() {
  static Loaded result;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    for (const std::string& path : module_candidates()) {
      if (!std::filesystem::exists(path)) {
        tried.push_back(path + " (absent)");
        continue;
      }
      // RTLD_LOCAL: the module's copies of the executor's classes stay its own.
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        tried.push_back(fmt::format("{} ({})", path, dlerror()));
        continue;
      }
      using Entry = const cuda_module::Table* (*)();
      auto entry = reinterpret_cast<Entry>(dlsym(handle, kSextantCudaModuleEntry));
      if (entry == nullptr) {
        tried.push_back(fmt::format("{} (no {} in it)", path, kSextantCudaModuleEntry));
        continue;
      }
      const cuda_module::Table* table = entry();
      if (table->abi_version != cuda_module::kAbiVersion) {
        tried.push_back(
            fmt::format("{} (interface version {}, this build needs {}: a module from "
                        "another build)",
                        path, table->abi_version, cuda_module::kAbiVersion));
        continue;
      }
      result.table = table;  // kept loaded for the life of the process
      return;
    }
    result.error = fmt::format(
        "the CUDA backend module {} could not be loaded (tried {}; set "
        "SEXTANT_CUDA_MODULE to its path)",
        kModuleFile, fmt::join(tried, "; "));
  });
  return result;
}

const cuda_module::Table& table_or_throw() {
  const Loaded& l = loaded();
  if (l.table == nullptr) throw std::runtime_error(l.error);
  return *l.table;
}

}  // namespace

bool built_with_cuda() {
  return true;
}

int cuda_device_count() {
  const Loaded& l = loaded();
  return l.table == nullptr ? 0 : l.table->device_count();
}

std::string cuda_unavailable_reason() {
  const Loaded& l = loaded();
  return l.table == nullptr ? l.error : l.table->unavailable_reason();
}

std::unique_ptr<Backend> make_cuda_backend(int device, Precision precision) {
  return table_or_throw().make_backend(device, precision);
}

std::unique_ptr<Communicator> make_device_communicator(CommKind kind, MPI_Comm comm,
                                                       std::string name) {
  return table_or_throw().make_communicator(kind, comm, std::move(name));
}

}  // namespace sextant::exec
