// How a sextant process (the command, and the rank processes it starts) asks glibc for memory.
#pragma once

namespace sextant::exec {

// Makes glibc's malloc keep freed memory in the heap instead of returning it to the kernel, so a
// buffer freed and allocated again is not page-faulted (zero-filled) again. Call once per
// process, before MPI_Init (the `sextant` command calls it first thing; rank processes started
// through exec::run_main or the benchmarks call it again, harmlessly).
//
// Why: Open MPI's collectives allocate their temporary buffers with malloc on every call, and glibc
// serves large requests with fresh mmap pages that it unmaps on free (mallopt(3): requests at or
// above M_MMAP_THRESHOLD, which adapts upwards only to the largest size freed so far). Every
// call then faults its buffer in again: on the 2-core CI machine a 4 MB MPI_Reduce_scatter_block
// between two ranks took 17.5 ms in `sextant bench comm` (0.73 ms with this setting; an
// all-reduce of 4 MB 0.74 ms), and the ZeRO-1 gradient bucket of gpt-tiny made dp2.z1.mb8 30%
// slower than plain data parallelism.
// The executor's own tensors come from a caching pool (src/cpu/cpu_backend.cpp) for the same
// reason. In `sextant plan`, whose leaders' simulations each build and free ~10 MB of programs and
// events, glibc trimmed the heap after each and the next faulted it in again: the simulation
// phase of GPT-3 175B on 1024 GPUs took 0.75 s instead of 0.38 s (60 K page faults against 25 K).
void keep_freed_host_memory();

}  // namespace sextant::exec
