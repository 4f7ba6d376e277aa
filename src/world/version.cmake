# Writes OUTPUT (version.cpp) from version.cpp.in with the git revision of SOURCE_DIR:
# "-dirty" when tracked files differ from HEAD, "unknown" outside a git checkout. Run at
# every build (the tandem_version target), so the revision follows commits, merges and
# checkouts; configure_file leaves OUTPUT untouched when its text is the same, so only a
# new revision recompiles it (one file) and relinks.
#   cmake -DSOURCE_DIR=... -DOUTPUT=... -DPROJECT_VERSION=... -P version.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE TANDEM_GIT_REVISION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE TANDEM_GIT_DIRTY OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT TANDEM_GIT_REVISION)
  set(TANDEM_GIT_REVISION unknown)
elseif(TANDEM_GIT_DIRTY)
  set(TANDEM_GIT_REVISION "${TANDEM_GIT_REVISION}-dirty")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/version.cpp.in ${OUTPUT} @ONLY)
