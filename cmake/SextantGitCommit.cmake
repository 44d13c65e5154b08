# Records the git commit of the source tree for outputs that must say what made them, at every
# build: a target runs WriteGitCommit.cmake, which rewrites spec's generated build_commit.cpp only
# when the commit (or whether the tree is dirty) changed, so a commit without a reconfigure is
# still named right and an unchanged one rebuilds nothing.
set(SEXTANT_BUILD_COMMIT_CPP ${CMAKE_BINARY_DIR}/spec/generated/build_commit.cpp)
add_custom_target(sextant_build_commit
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DOUT=${SEXTANT_BUILD_COMMIT_CPP}
          -P ${CMAKE_CURRENT_LIST_DIR}/WriteGitCommit.cmake
  BYPRODUCTS ${SEXTANT_BUILD_COMMIT_CPP}
  COMMENT "" VERBATIM)
