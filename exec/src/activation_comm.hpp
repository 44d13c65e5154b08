// Collectives and pipeline transfers of activation tensors of either type. fp32 tensors go to the
// communicator as they are; bf16 tensors through an fp32 copy, so that sums are taken in fp32 and
// MPI (which has no bf16 sum) can carry them. The copy doubles the bytes on the wire in mixed
// precision: native bf16 collectives on NCCL are the next step (tensor and pipeline parallelism
// only; gradients are fp32 and go to the communicator directly).
#pragma once

#include <memory>
#include <utility>

#include "sextant/exec/communicator.hpp"
#include "sextant/exec/kernels/memory.hpp"

namespace sextant::exec {

// Bytes per element that these calls put on the wire (4: the fp32 form of either type).
constexpr int64_t kActivationWireBytes = 4;

void all_reduce(Communicator& comm, DeviceMemory& be, Tensor& t);
// out: size() times in, blocks in rank order.
void all_gather(Communicator& comm, DeviceMemory& be, const Tensor& in, Tensor& out);
// in: size() times out; out: this rank's block of the sum.
void reduce_scatter(Communicator& comm, DeviceMemory& be, const Tensor& in, Tensor& out);
// in and out: size() blocks of equal size; block j of in goes to rank j, block j of out came from
// it.
void all_to_all(Communicator& comm, DeviceMemory& be, const Tensor& in, Tensor& out);
// A non-blocking send, and the tensor it reads: keep it until the request has been waited on.
std::pair<std::unique_ptr<CommRequest>, Tensor> send(Communicator& comm, DeviceMemory& be,
                                                     const Tensor& t, int peer, int tag);
void recv(Communicator& comm, DeviceMemory& be, Tensor& t, int peer, int tag);

}  // namespace sextant::exec
