# Script mode (cmake -P): writes OUT, the definition of sextant::spec::git_commit(), with the
# commit of SOURCE_DIR ("-dirty" when tracked files changed; "unknown" outside git), and leaves the
# file untouched when it would not change.
execute_process(
  COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(
    COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT dirty STREQUAL "")
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "// Generated at build time by cmake/WriteGitCommit.cmake.
#include \"sextant/spec/build_info.hpp\"

namespace sextant::spec {

const char* git_commit() { return \"${commit}\"; }

}  // namespace sextant::spec
")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
