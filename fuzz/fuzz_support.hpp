// What every fuzz target checks: a reader given any bytes either accepts them or refuses them with
// the documented InputError (file, field, expectation). Anything else that escapes (a JSON library
// exception, std::out_of_range, ...) is a finding, as are the sanitizers' reports (ASan, UBSan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "sextant/spec/error.hpp"

namespace sextant::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

template <typename Read>
int expect_clear_error(const uint8_t* data, size_t size, Read&& read) {
  try {
    read(as_text(data, size));
  } catch (const sextant::InputError&) {
    // The documented refusal.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: escaped without an InputError: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace sextant::fuzz
