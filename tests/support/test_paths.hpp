// Paths of the source tree and test data, injected by tests/CMakeLists.txt.
#pragma once

#include <string>

namespace sextant::test {

inline std::string source_path(const std::string& relative) {
  return std::string(SEXTANT_SOURCE_DIR) + "/" + relative;
}
inline std::string data_path(const std::string& relative) {
  return std::string(SEXTANT_TEST_DATA) + "/" + relative;
}

}  // namespace sextant::test
