#!/usr/bin/env python3
"""Sustained bandwidth of eager PyTorch's memory-bound kernel families in a PyTorch-profiler trace.

The families the cluster files' `memory_efficiency_by_kernel` prices (docs/FORMATS.md):
  mixed_dtype  TensorIterator's dynamic-casting path (aten/src/ATen/native/cuda/CUDALoops.cuh:
               an elementwise op whose inputs differ in dtype from its output runs
               unrolled_elementwise_kernel with LoadWithCast / StoreWithCast, no vector loads):
               bf16 -> fp32 copies (direct_copy_kernel_cuda) and fp32 (+) bf16 binaries.
  native_norm  ATen's layer_norm / rms_norm kernels (vectorized_layer_norm_kernel forward,
               layer_norm_grad_input_kernel and GammaBetaBackward backward), counting only launches
               whose grid fills at least half the SMs; a narrower GammaBetaBackward gives the
               bandwidth one block draws (`block_bandwidth_GBps`).
  strided      TensorIterator's legacy elementwise_kernel<128, 4> copies of non-contiguous tensors
               (repeat_kv's expanded keys and values, transposed heads), bytes counted as each
               output element read and written.
  embedding_backward
               ATen's embedding_dense_backward segment sums (compute_grad_weight, sum_and_scatter),
               16 bytes per element of the token gradient (EmbeddingBackwardKernel.cu: the row read,
               an fp32 partial written and read, the row written), whatever its dtype; and the
               radix sort before them (8 onesweep passes of 8-byte keys and values, read and
               written, from aten::embedding_dense_backward's index count).
  vectorized   the same-dtype vectorized_elementwise_kernel launches, for comparison.
The fifth family, cast_transpose (Transformer Engine's fp8 casts), runs in no eager PyTorch
trace; the cluster files cite a kernel timing of their own for it.
Bytes come from each launch's element count (grid x elements per block) and the dtypes the
kernel's template names; only launches of at least 1M elements count, so the tails of small
launches do not bias the rate. Usage: eager_kernel_rates.py TRACE.json.gz HBM_GBps SMS
"""
import gzip
import json
import re
import sys


def elements_per_block(name):
    if name.startswith("void at::native::unrolled_elementwise_kernel"):
        return 512  # 128 threads x 4 elements (CUDALoops.cuh: thread_work_size 4)
    m = re.match(r"void at::native::vectorized_elementwise_kernel<(\d+),", name)
    if m:
        return 128 * 4 * (2 if m.group(1) == "8" else 1)  # vec 8: bf16 launches of 1024
    return None


def mixed_bytes(name):
    """Bytes per element of a dynamic-casting launch, or None when it is not one."""
    if not name.startswith("void at::native::unrolled_elementwise_kernel"):
        return None
    if "direct_copy_kernel_cuda" in name and "lambda(float)" in name:
        return 2 + 4  # bf16 in, fp32 out
    if "LoadWithCast<2>" in name and ("<float>" in name):
        return 2 + 4 + 4  # one bf16 and one fp32 input, fp32 out
    return None


STRIDED_COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
                "at::native::direct_copy_kernel_cuda")


def embedding_backward(events, ops, rates):
    """The segment sums' element rate and the sort's bandwidth, from the op's gradient dims."""
    sort = [0.0, 0.0]
    for e in events:
        if e.get("cat") != "kernel":
            continue
        op = ops.get(e.get("args", {}).get("External id"))
        if not op or op["name"] != "aten::embedding_dense_backward":
            continue
        dims = op["args"]["Input Dims"]
        tokens = 1
        for n in dims[1]:
            tokens *= n
        elements = tokens * dims[0][-1]
        if "compute_grad_weight" in e["name"] or "sum_and_scatter" in e["name"]:
            rates["embedding_backward"][0] += 8 * elements  # each kernel half of the 16 bytes
            rates["embedding_backward"][1] += float(e["dur"])
        elif "Onesweep" in e["name"]:
            sort[0] += 32 * tokens
            sort[1] += float(e["dur"])
    if sort[1] > 0:
        print(f"embedding sort {sort[0] / sort[1] / 1e3:5.1f} GB/s: radix sort passes of 8-byte "
              f"keys and values ({sort[0] / 1e6:.1f} MB in {sort[1]:.1f} us)")


def main():
    path, hbm, sms = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    events = json.load(gzip.open(path))["traceEvents"]
    rates = {"mixed_dtype": [0.0, 0.0], "vectorized": [0.0, 0.0], "native_norm": [0.0, 0.0],
             "strided": [0.0, 0.0], "embedding_backward": [0.0, 0.0]}
    ops = {e["args"].get("External id"): e for e in events
           if e.get("cat") == "cpu_op" and "args" in e}
    embedding_backward(events, ops, rates)
    norm_rows = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        name, dur = e["name"], float(e["dur"])
        grid = (e.get("args", {}).get("grid") or [0])[0]
        if name.startswith(STRIDED_COPY) and grid * 512 >= 1 << 20:
            e_out = 2 if "BFloat16" in name or "Half" in name else 4
            rates["strided"][0] += grid * 512 * 2 * e_out  # 128 threads x 4 elements a block
            rates["strided"][1] += dur
        per_block = elements_per_block(name)
        if per_block and grid * per_block >= 1 << 20:
            n = grid * per_block
            b = mixed_bytes(name)
            if b is not None:
                rates["mixed_dtype"][0] += n * b
                rates["mixed_dtype"][1] += dur
            elif name.startswith("void at::native::vectorized_elementwise_kernel<8, at::native::"
                                 "bfloat16_copy_kernel_cuda"):
                rates["vectorized"][0] += n * 6
                rates["vectorized"][1] += dur
        if "layer_norm" in name or "GammaBeta" in name:
            norm_rows.setdefault(re.sub(r"<.*", "", name.replace("void at::native::", "")),
                                 []).append((grid, dur, name))
    # Norms: rows x width from the forward launch (one block per row), dtype from the template.
    fwd = [r for k, v in norm_rows.items() if "vectorized_layer_norm_kernel" in k for r in v]
    if fwd:
        rows = fwd[0][0]
        e_in = 4 if "<float, float" in fwd[0][2] else 2
        width = None
        for k, v in norm_rows.items():
            if "GammaBeta" in k:
                width = v[0][0] * 32  # GammaBetaBackward: one block per 32 columns
        if width:
            elements = rows * width
            for k, v in norm_rows.items():
                passes = 2 if "vectorized_layer_norm" in k else 3 if "grad_input" in k else 2
                if "GammaBeta" in k and 2 * v[0][0] < sms:
                    gbps = elements * passes * e_in * len(v) / sum(d for _, d, _ in v) / 1e3
                    print(f"block_bandwidth {gbps / v[0][0]:5.1f} GB/s a block: GammaBetaBackward's "
                          f"{v[0][0]} blocks (one per 32 columns) of {sms} SMs drew {gbps:.0f} GB/s;"
                          " left out of native_norm")
                    continue
                rates["native_norm"][0] += elements * passes * e_in * len(v)
                rates["native_norm"][1] += sum(d for _, d, _ in v)
    for family, (nbytes, us) in rates.items():
        if us > 0:
            gbps = nbytes / us / 1e3
            print(f"{family:12s} {gbps:7.0f} GB/s = {gbps / hbm:.2f} of {hbm:.0f} GB/s "
                  f"({nbytes / 1e9:.1f} GB in {us / 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
