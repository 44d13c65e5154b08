// Readers of the measurements users already have: nccl-tests text output and PyTorch profiler
// (Kineto) Chrome traces. Each throws InputError naming the file and what is wrong.
#pragma once

#include <string>

#include "sextant/traces/samples.hpp"

namespace sextant::traces {

// nccl-tests output (all_reduce_perf and friends): the out-of-place time of every size row. The
// collective comes from a "KIND:" prefix of `path_spec` (e.g. "all_gather:log.txt"), from a
// "<kind>_perf" mention in the file, or from the file name; the rank count from its "#  Rank"
// lines.
Samples read_nccl_tests(const std::string& path_spec);
Samples parse_nccl_tests(const std::string& text, const std::string& source,
                         std::optional<spec::CollectiveKind> kind);

// A PyTorch profiler trace (torch.profiler with record_shapes=True, exported with
// export_chrome_trace): GEMMs (aten::mm, addmm, bmm, baddbmm) with their FLOPs from the input
// shapes, memory-bound aten ops with their bytes, and collectives recorded with message sizes
// ("nccl:*" or record_param_comms ops). GPU kernel time is used when kernels are linked to the
// op by "External id", else the op's own time.
Samples read_kineto(const std::string& path);
Samples parse_kineto(const spec::Json& json, const std::string& source);

}  // namespace sextant::traces
