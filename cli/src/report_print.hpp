// Human-readable rendering of a Report.
#pragma once

#include <optional>

#include "published_mfu.hpp"
#include "sextant/spec/report.hpp"

namespace sextant::cli {

// `reference`: the best published MFU for the report's GPU and precision, printed beside its MFU.
void print_report(const spec::Report& report,
                  const std::optional<PublishedMfu>& reference = std::nullopt);

}  // namespace sextant::cli
