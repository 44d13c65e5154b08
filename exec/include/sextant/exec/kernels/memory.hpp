// A backend's memory: allocation, typed tensors, host transfers and timing marks (backend.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

// A box of a feature map: planes, rows and columns [begin, end) (a 2D map: plane [0, 1)). Plain
// numbers, so that the C++17 CUDA sources read it (spec::MapBlock is the planner's form).
struct Box {
  int64_t plane_begin, plane_end, row_begin, row_end, col_begin, col_end;
  int64_t planes() const { return plane_end - plane_begin; }
  int64_t rows() const { return row_end - row_begin; }
  int64_t cols() const { return col_end - col_begin; }
  int64_t elements() const { return planes() * rows() * cols(); }
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  Tensor empty(std::vector<int64_t> shape, DType dtype = DType::kF32);
  Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kF32);
  virtual DType activation_dtype() const { return DType::kF32; }
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* data) = 0;
  virtual void fill(Tensor& t, float value) = 0;
  // Element by element, converting when the types differ (fp32 -> bf16 rounds to nearest even).
  virtual void copy(const Tensor& from, Tensor& to) = 0;
  // Host vectors are fp32 whatever the tensor's type.
  virtual void to_host(const Tensor& t, std::vector<float>& out) = 0;
  virtual void from_host(const std::vector<float>& in, Tensor& t) = 0;
  // Box `r` of each of `maps` maps (fp32), from `from`, which holds box `held_from` of every map,
  // into `to`, which holds `held_to`; added when `add` (the blocks and halos of split maps, the
  // padding of whole ones: spatial_exchange.hpp).
  virtual void copy_box(const Tensor& from, const Box& held_from, Tensor& to, const Box& held_to,
                        const Box& r, int64_t maps, bool add) = 0;
  virtual void synchronize() = 0;

  // Timing that does not stall the device: a mark records "now" in the order of the backend's
  // work (a CUDA event on the compute stream; on the CPU, the host clock), and seconds_between
  // waits for the later mark to be reached.
  class TimeMark {
   public:
    virtual ~TimeMark() = default;
  };
  virtual std::unique_ptr<TimeMark> mark();
  virtual double seconds_between(const TimeMark& from, const TimeMark& to);
};

}  // namespace sextant::exec
