# Records the git commit of the source tree at configure time, for outputs that must say what made them.
execute_process(
  COMMAND git -C "${CMAKE_SOURCE_DIR}" rev-parse --short=12 HEAD
  OUTPUT_VARIABLE SEXTANT_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR SEXTANT_GIT_COMMIT STREQUAL "")
  set(SEXTANT_GIT_COMMIT "unknown")
endif()
execute_process(
  COMMAND git -C "${CMAKE_SOURCE_DIR}" status --porcelain --untracked-files=no
  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT dirty STREQUAL "")
  string(APPEND SEXTANT_GIT_COMMIT "-dirty")
endif()
