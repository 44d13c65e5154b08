// A backend's memory: allocation, typed tensors, host transfers and timing marks (backend.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sextant/exec/tensor.hpp"

namespace sextant::exec {

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
