// A compute backend: memory and the kernels the GPT, MLP and CNN stages need, forward and
// backward, one interface per family (kernels/*.hpp). The CPU backend implements them with Eigen
// on fp32; the CUDA backend with cuBLAS and its own kernels. Layout, batching and communication
// live above this interface and are shared. Code that needs one family takes that interface
// (tensors, parameters, the recorder and activation transfers take DeviceMemory; activations.hpp
// takes ElementwiseKernels); a stage takes the whole Backend.
//
// Conventions: row-major matrices; x is [rows, in], a linear weight is [in, out]. Backward
// kernels accumulate (+=) into weight and bias gradients, and overwrite input gradients.
//
// Types (mixed precision as in Megatron-LM): activations, their gradients and the parameters'
// compute copy (weights, biases, norms, tables as the kernels read them) share one type, fp32 or
// bf16 (activation_dtype()); parameter gradients (dw, db, dgamma, dbeta, dtable, dpos), layer
// norm statistics, sum_squares and everything AdamW touches are fp32. Arithmetic is fp32 inside
// every kernel; bf16 is a storage format. The convolution family (kernels/convolution.hpp) takes
// fp32 tensors only: CNNs run in fp32.
#pragma once

#include <string>

#include "sextant/exec/kernels/attention.hpp"
#include "sextant/exec/kernels/convolution.hpp"
#include "sextant/exec/kernels/elementwise.hpp"
#include "sextant/exec/kernels/linear.hpp"
#include "sextant/exec/kernels/memory.hpp"
#include "sextant/exec/kernels/norm.hpp"
#include "sextant/exec/kernels/optimizer.hpp"
#include "sextant/exec/kernels/vocabulary.hpp"
#include "sextant/spec/executor_kind.hpp"

namespace sextant::exec {

class Backend : public DeviceMemory,
                public LinearKernels,
                public NormKernels,
                public ElementwiseKernels,
                public AttentionKernels,
                public VocabularyKernels,
                public OptimizerKernels,
                public ConvolutionKernels {
 public:
  ~Backend() override = default;
  virtual std::string name() const = 0;
  // What runs here, as the executor's capabilities (spec/executor_support.hpp) ask.
  virtual spec::ExecutorBackend kind() const = 0;
  virtual spec::ExecutorPrecision precision() const = 0;
};

}  // namespace sextant::exec
