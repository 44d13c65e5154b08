// Errors: InputError for bad user input (collects every problem of one file), SEXTANT_CHECK for
// programming errors (stays on in Release). Library code never exits on bad input; main does.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace sextant {

// One problem in an input: where (JSON pointer, or a flag name), the offending value, what was
// expected. Formatted as "<pointer> = <value>: <expected>" (without " = <value>" when empty).
struct Problem {
  std::string pointer;
  std::string value;
  std::string expected;
};

// Bad input: a file, a JSON document or a command-line request that cannot be used. what() is one
// line per problem, each "<source>: <pointer> = <value>: <expected>".
class InputError : public std::runtime_error {
 public:
  InputError(std::string source, std::vector<Problem> problems);
  InputError(std::string source, std::string pointer, std::string value, std::string expected);

  const std::string& source() const { return source_; }
  const std::vector<Problem>& problems() const { return problems_; }

 private:
  std::string source_;
  std::vector<Problem> problems_;
};

// Collects the problems found while reading one input, so that all of them are reported together.
class Diagnostics {
 public:
  explicit Diagnostics(std::string source) : source_(std::move(source)) {}

  void add(std::string pointer, std::string value, std::string expected) {
    problems_.push_back({std::move(pointer), std::move(value), std::move(expected)});
  }
  bool ok() const { return problems_.empty(); }
  const std::string& source() const { return source_; }
  // Throws InputError with every problem collected so far; does nothing when there are none.
  void throw_if_any() const;

 private:
  std::string source_;
  std::vector<Problem> problems_;
};

// A broken invariant inside Sextant (not bad input). Always checked, also in Release builds.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void fail_check(const char* condition, const char* file, int line,
                             const std::string& message);

}  // namespace sextant

#define SEXTANT_CHECK(cond, ...)                                                             \
  do {                                                                                       \
    if (!(cond)) ::sextant::fail_check(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (false)
