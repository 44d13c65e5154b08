#include "activation_comm.hpp"

#include "sextant/spec/error.hpp"

namespace sextant::exec {

namespace {

bool bf16(const Tensor& t) {
  return t.dtype() == DType::kBF16;
}
uint16_t* bits(Tensor& t) {
  return static_cast<uint16_t*>(t.raw());
}
const uint16_t* bits(const Tensor& t) {
  return static_cast<const uint16_t*>(t.raw());
}

void check_same_type(const Tensor& in, const Tensor& out, const char* call) {
  SEXTANT_CHECK(in.dtype() == out.dtype(), "{} of {} into {}", call, dtype_name(in.dtype()),
                dtype_name(out.dtype()));
}

}  // namespace

void all_reduce(Communicator& comm, Tensor& t) {
  if (bf16(t)) {
    comm.all_reduce_bf16(bits(t), t.numel());
  } else {
    comm.all_reduce(t.data(), t.numel());
  }
}

void all_gather(Communicator& comm, const Tensor& in, Tensor& out) {
  check_same_type(in, out, "all_gather");
  if (bf16(in)) {
    comm.all_gather_bf16(bits(in), bits(out), in.numel());
  } else {
    comm.all_gather(in.data(), out.data(), in.numel());
  }
}

void reduce_scatter(Communicator& comm, const Tensor& in, Tensor& out) {
  check_same_type(in, out, "reduce_scatter");
  if (bf16(in)) {
    comm.reduce_scatter_bf16(bits(in), bits(out), out.numel());
  } else {
    comm.reduce_scatter(in.data(), out.data(), out.numel());
  }
}

void all_to_all(Communicator& comm, const Tensor& in, Tensor& out) {
  check_same_type(in, out, "all_to_all");
  const int64_t block = in.numel() / comm.size();
  if (bf16(in)) {
    comm.all_to_all_bf16(bits(in), bits(out), block);
  } else {
    comm.all_to_all(in.data(), out.data(), block);
  }
}

std::pair<std::unique_ptr<CommRequest>, Tensor> send(Communicator& comm, const Tensor& t, int peer,
                                                     int tag) {
  auto request = bf16(t) ? comm.send_bf16(bits(t), t.numel(), peer, tag)
                         : comm.send(t.data(), t.numel(), peer, tag);
  return {std::move(request), t};
}

void recv(Communicator& comm, Tensor& t, int peer, int tag) {
  if (bf16(t)) {
    comm.recv_bf16(bits(t), t.numel(), peer, tag);
  } else {
    comm.recv(t.data(), t.numel(), peer, tag);
  }
}

}  // namespace sextant::exec
