// glibc malloc settings for rank processes (host_allocator.hpp says why).
#include "sextant/exec/host_allocator.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc systems

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace sextant::exec {

void keep_freed_host_memory() {
#if defined(__GLIBC__)
  // No mmap-served blocks: every request comes from the heap, where freed blocks are reused.
  mallopt(M_MMAP_MAX, 0);
  // Keep up to 1 GiB of free memory at the top of the heap rather than trimming it (trimming
  // returns the pages, and the next allocation faults them in again).
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace sextant::exec
