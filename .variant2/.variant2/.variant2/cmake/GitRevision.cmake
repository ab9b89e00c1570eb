# The commit recorded in benchmark output. EPCOMM_GIT_REVISION in the environment wins (a copy of
# the tree without .git, e.g. on a lent GPU machine); otherwise ask git, with "-dirty" when tracked
# files differ from that commit (so a copy whose .git is older than its files says so); otherwise
# "unknown".
if(DEFINED ENV{EPCOMM_GIT_REVISION})
  set(EPCOMM_GIT_REVISION "$ENV{EPCOMM_GIT_REVISION}")
else()
  execute_process(COMMAND git rev-parse --short=12 HEAD
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    OUTPUT_VARIABLE EPCOMM_GIT_REVISION OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET RESULT_VARIABLE _git_result)
  if(NOT _git_result EQUAL 0 OR EPCOMM_GIT_REVISION STREQUAL "")
    set(EPCOMM_GIT_REVISION "unknown")
  else()
    execute_process(COMMAND git status --porcelain --untracked-files=no
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      OUTPUT_VARIABLE _git_changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _git_changes STREQUAL "")
      string(APPEND EPCOMM_GIT_REVISION "-dirty")
    endif()
  endif()
endif()
message(STATUS "epcomm revision: ${EPCOMM_GIT_REVISION}")
# A header (with the CUDA architectures too), rewritten only when its contents change: a new
# commit recompiles its two users (buffer.cpp and the bench) and relinks. (scripts/build.sh
# configures on every build, so a kept build folder follows HEAD.)
configure_file(${PROJECT_SOURCE_DIR}/cmake/build_info.hpp.in ${PROJECT_BINARY_DIR}/generated/epcomm_build_info.hpp)
