// A JSON resource compiled into the binary (the model zoo, the cluster files), see
// cmake/SextantEmbed.
#pragma once

#include <string_view>

namespace sextant::spec {

struct EmbeddedFile {
  std::string_view name;  // file name without extension, e.g. "gpt3-175b"
  std::string_view text;  // the file's JSON text
};

}  // namespace sextant::spec
