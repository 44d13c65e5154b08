// Parts of a device description that model kernels rather than peaks: the shape-aware GEMM model
// (tiles and waves over the SMs, split-K, the clock sustained under training load) and the
// published throughput of fused attention kernels. Read from a cluster file's "device" object.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sextant/spec/json_reader.hpp"
#include "sextant/spec/stack.hpp"

namespace sextant::spec {

// A thread-block tile of the output matrix (rows x columns).
struct GemmTile {
  int64_t m = 0;
  int64_t n = 0;
};

// GEMM time from how cuBLAS runs it (NVIDIA, "Matrix Multiplication Background User's Guide":
// tile and wave quantization): the output is cut into tiles, a wave runs one tile per SM, each
// tile streams K (plus a pipeline fill and epilogue worth `tile_overhead_k`) through the tensor
// cores at `mainloop_efficiency` of their per-SM peak at the sustained clock. The library picks the
// fastest tile and split-K factor.
struct GemmModel {
  int64_t sms = 0;
  double peak_clock_MHz = 0;  // the clock the datasheet peak_tflops assume
  double clock_MHz = 0;       // the clock sustained under training load
  double mainloop_efficiency = 0;
  double tile_overhead_k = 0;     // K elements' worth of time per tile for fill and epilogue
  double kernel_overhead_us = 0;  // per kernel on the device (ramp-up and tail)
  std::vector<GemmTile> tiles;
  int64_t max_split_k = 1;
  // A GEMM whose N or K (the operands' leading dimensions) is not a multiple of 16 bytes runs at
  // this fraction of the aligned model's rate: cuBLAS cannot use its vectorised / TMA kernels for
  // such operands (NVIDIA, Matrix Multiplication Background User's Guide, "Tensor Core
  // requirements"). 1: not modelled.
  double misaligned_efficiency = 1;
  // An fp8 GEMM that accumulates in full precision (Transformer Engine's data- and weight-gradient
  // GEMMs: use_split_accumulator) runs at this fraction of the fast-accumulation rate the GEMM
  // model and the power object describe (forward GEMMs). 1: not modelled.
  double fp8_split_accumulator_efficiency = 1;
  std::string source;
};

// Published throughput of one attention kernel: TFLOP/s (in the FlashAttention convention:
// causal counts half the scores, the backward 2.5x the forward) by sequence length, for one head
// dimension, mask and pass ("fwd", "bwd" or "fwd+bwd" for a figure that times both together).
struct AttentionCurve {
  int64_t head_dim = 0;
  bool causal = false;
  std::string pass;
  std::vector<double> seq_len;
  std::vector<double> tflops;
};

// What dropout on the attention probabilities adds to a fused kernel: GPU time per score element
// it draws a random number for (b x heads x sq x sk, half under a causal mask), in picoseconds at
// the kernel data's clock; the backward draws the same mask again.
struct AttentionDropoutCost {
  double fwd_ps = 0;
  double bwd_ps = 0;
};

struct AttentionKernelData {
  std::optional<AttentionKernel> same_as;  // this kernel runs another's code on this device
  std::vector<AttentionCurve> curves;
  // The SM clock the curves were measured at; the kernel's throughput scales with the clock the
  // device sustains (PowerModel). Absent: used as published.
  std::optional<double> clock_MHz;
  std::optional<AttentionDropoutCost> dropout;  // absent: dropout inside the kernel not priced
  std::string source;
};

// The kernel whose published data `kernel` uses (following same_as: a kernel that runs another's
// code on this device).
AttentionKernel attention_data_kernel(const std::map<AttentionKernel, AttentionKernelData>& kernels,
                                      AttentionKernel kernel);

// Achieved TFLOP/s of `kernel` for one pass ("fwd" or "bwd"), interpolated in log(seq_len) and
// linearly in head_dim between published curves, clamped outside them. A pass without causal data
// scales the non-causal curve by the causal/non-causal ratio of the other pass at the same length.
// Throws InputError naming the device when the cluster has no data for the kernel.
double attention_tflops(const std::map<AttentionKernel, AttentionKernelData>& kernels,
                        const std::string& device, AttentionKernel kernel, int64_t head_dim,
                        int64_t seq_len, bool causal, bool backward);

// Decoders for the cluster reader; problems go to the reader's diagnostics.
GemmModel decode_gemm_model(ObjectReader& r);
std::map<AttentionKernel, AttentionKernelData> decode_attention_kernels(ObjectReader& r);
Json to_json(const GemmModel& g);
Json to_json(const std::map<AttentionKernel, AttentionKernelData>& kernels);

}  // namespace sextant::spec
