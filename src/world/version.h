// What this build is: the release version and the git revision it was built from, kept
// in one generated source file so a new revision recompiles one file, not the library.
#pragma once

namespace tandem {
const char* tandem_version();
const char* tandem_git_revision();  // short hash, "-dirty" when built with local changes
}
