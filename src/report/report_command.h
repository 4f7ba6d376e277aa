// `tandem report RUN_FOLDER`: writes the folder's report.html from its run.h5.
#pragma once
#include <iostream>

namespace tandem {

int report_command(int argc, char** argv, std::ostream& out = std::cout, std::ostream& err = std::cerr);

}  // namespace tandem
