// A stack's overlaps as the cluster's devices let them run.
#pragma once

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::spec {

// Whether the cluster's collectives run on the cores that compute, so that no communication
// overlaps compute: CPU ranks (one core each) copy and sum the messages of a shared-memory or
// network transport themselves, and Open MPI without an asynchronous progress thread (off in the
// default build) advances a non-blocking collective only inside MPI calls, so Sextant's
// MpiCommunicator calls the blocking one where a bucket is ready
// (exec/src/comm/mpi_communicator.cpp). A GPU's collectives run on streams of their own beside its
// kernels.
bool collectives_block(const ClusterSpec& cluster);

// `stack` as it runs on `cluster`: where collectives block, every overlap knob off (gradient
// reductions after the backward or waited for layer by layer, ZeRO-1/2 gathers after the update,
// stage transfers waited for, tensor-parallel collectives exposed) and ZeRO-3 gathering each
// layer on use (zero3_prefetch 0); elsewhere `stack` unchanged.
Stack stack_on(const ClusterSpec& cluster, const Stack& stack);

}  // namespace sextant::spec
