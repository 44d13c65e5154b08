// InputError formatting and the SEXTANT_CHECK failure path.
#include "sextant/spec/error.hpp"

namespace sextant {
namespace {

// At most this many problems are printed, then a count of the rest: a cluster file with 10^6 bad
// GEMM points printed 999,999 lines.
constexpr size_t kMaxPrintedProblems = 20;

std::string format_problems(const std::string& source, const std::vector<Problem>& problems) {
  std::string out;
  for (size_t i = 0; i < problems.size(); ++i) {
    const Problem& p = problems[i];
    if (i == kMaxPrintedProblems) {
      out += fmt::format("\n{}: ... and {} more problem(s)", source, problems.size() - i);
      break;
    }
    if (!out.empty()) out += '\n';
    out += source;
    if (!p.pointer.empty()) out += ": " + p.pointer;
    if (!p.value.empty()) out += " = " + p.value;
    out += ": " + p.expected;
  }
  return out;
}

}  // namespace

InputError::InputError(std::string source, std::vector<Problem> problems)
    : std::runtime_error(format_problems(source, problems)),
      source_(std::move(source)),
      problems_(std::move(problems)) {}

InputError::InputError(std::string source, std::string pointer, std::string value,
                       std::string expected)
    : InputError(std::move(source), std::vector<Problem>{{std::move(pointer), std::move(value),
                                                          std::move(expected)}}) {}

void Diagnostics::throw_if_any() const {
  if (!problems_.empty()) throw InputError(source_, problems_);
}

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: check '{}' failed: {}", file, line,
                                  condition, message));
}

}  // namespace sextant
