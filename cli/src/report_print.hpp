// Human-readable rendering of a Report.
#pragma once

#include "sextant/spec/report.hpp"

namespace sextant::cli {

void print_report(const spec::Report& report);

}  // namespace sextant::cli
