# Warning and sanitizer flags shared by every Sextant target.
function(sextant_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wfloat-conversion>)
  # GCC 12 reports false -Warray-bounds/-Wstringop-overflow inside libstdc++ containers of
  # nlohmann::json at -O3 (GCC bug 107138 family), and -Wmaybe-uninitialized inside the AVX-512
  # intrinsics headers that Eigen uses with -march=native; they are not in our code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-array-bounds -Wno-stringop-overflow -Wno-restrict -Wno-maybe-uninitialized>)
  endif()
  if(SEXTANT_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  if(SEXTANT_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(SEXTANT_SANITIZE)
    # Undefined behaviour stops the program (a test or a fuzz run fails) instead of printing.
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(SEXTANT_FUZZ)
    # Coverage feedback for libFuzzer from every library, not only from the fuzz target's file.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()
