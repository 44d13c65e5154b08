# Embeds JSON resource files (the model zoo, the cluster files) into a C++ source so that the
# `sextant` binary works from any directory. Regenerated whenever one of the files changes.
set(SEXTANT_EMBED_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/embed_files.cmake")

# sextant_embed_files(<output.cpp> <namespace> <function> FILES <f>...)
# Generates `std::span<const EmbeddedFile> <namespace>::<function>()`.
function(sextant_embed_files output namespace function)
  cmake_parse_arguments(ARG "" "" "FILES" ${ARGN})
  string(REPLACE ";" "|" files_arg "${ARG_FILES}")
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${output} -DNAMESPACE=${namespace} -DFUNCTION=${function}
            "-DFILES=${files_arg}" -P ${SEXTANT_EMBED_SCRIPT}
    DEPENDS ${ARG_FILES} ${SEXTANT_EMBED_SCRIPT}
    COMMENT "Embedding ${function} resources"
    VERBATIM)
endfunction()
