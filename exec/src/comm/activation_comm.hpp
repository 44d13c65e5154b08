// Collectives and pipeline transfers of activation tensors of either type, in their own type: fp32
// as fp32, bf16 as bf16 (2 bytes an element on the wire, as Megatron-LM moves activations in
// mixed precision; sums are bf16 sums, NCCL's semantics). Gradients are fp32 and go to the
// communicator directly.
#pragma once

#include <memory>
#include <utility>

#include "sextant/exec/communicator.hpp"
#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

// Bytes on the wire for `elements` activations of type `type`: what the traces record.
inline int64_t activation_wire_bytes(DType type, int64_t elements) {
  return elements * element_size(type);
}

void all_reduce(Communicator& comm, Tensor& t);
// out: size() times in, blocks in rank order.
void all_gather(Communicator& comm, const Tensor& in, Tensor& out);
// in: size() times out; out: this rank's block of the sum.
void reduce_scatter(Communicator& comm, const Tensor& in, Tensor& out);
// in and out: size() blocks of equal size; block j of in goes to rank j, block j of out came from
// it.
void all_to_all(Communicator& comm, const Tensor& in, Tensor& out);
// A non-blocking send, and the tensor it reads: keep it until the request has been waited on.
std::pair<std::unique_ptr<CommRequest>, Tensor> send(Communicator& comm, const Tensor& t, int peer,
                                                     int tag);
void recv(Communicator& comm, Tensor& t, int peer, int tag);

}  // namespace sextant::exec
