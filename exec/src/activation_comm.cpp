// Activation collectives through an fp32 form.
#include "activation_comm.hpp"

namespace sextant::exec {

namespace {

// t itself when fp32, else an fp32 copy of it.
Tensor wide(DeviceMemory& be, const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor w = be.empty(t.shape());
  be.copy(t, w);
  return w;
}
// Where a collective writes t's fp32 form: t itself, or a new fp32 tensor copied into t after.
Tensor landing(DeviceMemory& be, const Tensor& t) {
  return t.dtype() == DType::kF32 ? t : be.empty(t.shape());
}
void land(DeviceMemory& be, const Tensor& result, Tensor& t) {
  if (t.dtype() != DType::kF32) be.copy(result, t);
}

}  // namespace

void all_reduce(Communicator& comm, DeviceMemory& be, Tensor& t) {
  Tensor w = wide(be, t);
  comm.all_reduce(w.data(), w.numel());
  land(be, w, t);
}

void all_gather(Communicator& comm, DeviceMemory& be, const Tensor& in, Tensor& out) {
  Tensor w = landing(be, out);
  comm.all_gather(wide(be, in).data(), w.data(), in.numel());
  land(be, w, out);
}

void reduce_scatter(Communicator& comm, DeviceMemory& be, const Tensor& in, Tensor& out) {
  Tensor w = landing(be, out);
  comm.reduce_scatter(wide(be, in).data(), w.data(), out.numel());
  land(be, w, out);
}

void all_to_all(Communicator& comm, DeviceMemory& be, const Tensor& in, Tensor& out) {
  Tensor w = landing(be, out);
  comm.all_to_all(wide(be, in).data(), w.data(), in.numel() / comm.size());
  land(be, w, out);
}

std::pair<std::unique_ptr<CommRequest>, Tensor> send(Communicator& comm, DeviceMemory& be,
                                                     const Tensor& t, int peer, int tag) {
  Tensor w = wide(be, t);
  auto request = comm.send(w.data(), w.numel(), peer, tag);
  return {std::move(request), w};
}

void recv(Communicator& comm, DeviceMemory& be, Tensor& t, int peer, int tag) {
  Tensor w = landing(be, t);
  comm.recv(w.data(), w.numel(), peer, tag);
  land(be, w, t);
}

}  // namespace sextant::exec
