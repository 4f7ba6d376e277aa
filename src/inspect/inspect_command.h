// `tandem inspect FILE`: what a run file or a checkpoint holds, readable or as JSON.
// Exit codes: 0 read whole; 1 a damaged file (which object failed is named); 2 bad flags,
// a missing file, or a file that is not HDF5 or not tandem's.
#pragma once
#include <iostream>

namespace tandem {

int inspect_command(int argc, char** argv, std::ostream& out = std::cout, std::ostream& err = std::cerr);

}  // namespace tandem
