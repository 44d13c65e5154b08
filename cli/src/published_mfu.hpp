// The best model FLOPs utilisation published for a GPU and precision, so that a prediction above
// it is flagged as implausible rather than taken as a plan's promise.
#pragma once

#include <optional>
#include <string>

#include "sextant/spec/cluster_spec.hpp"
#include "sextant/spec/dtype.hpp"
#include "sextant/spec/plan.hpp"

namespace sextant::cli {

struct PublishedMfu {
  double mfu = 0;  // against the 16-bit dense peak, as Report::mfu (fp8 runs too)
  std::string source;
};

// The best published MFU for a device (by the name in its cluster file: A100, H100, H200, V100)
// running GEMMs in `gemm_dtype`; nullopt when none is known.
std::optional<PublishedMfu> best_published_mfu(const std::string& device_name,
                                               spec::Dtype gemm_dtype);

// The same for `plan` on `cluster`: its GPU and the precision its GEMMs run in under `stack`.
std::optional<PublishedMfu> best_published_mfu(const spec::ClusterSpec& cluster,
                                               const spec::Plan& plan, const spec::Stack& stack);

// One line for `simulate` and `plan`: the reference, and a warning when `mfu` exceeds it
// ("" when no reference is known).
std::string mfu_plausibility_line(double mfu, const std::optional<PublishedMfu>& reference);

}  // namespace sextant::cli
