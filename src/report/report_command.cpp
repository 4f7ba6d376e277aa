#include "report/report_command.h"

#include <boost/program_options.hpp>

#include <filesystem>
#include <string>

#include "deck/command_flags.h"
#include "io/run_file.h"
#include "report/report_html.h"

namespace tandem {

int report_command(int argc, char** argv, std::ostream& out, std::ostream& err) {
  namespace po = boost::program_options;
  po::options_description flags_spec(
      "tandem report RUN_FOLDER: writes RUN_FOLDER/report.html from RUN_FOLDER/run.h5, one static\n"
      "file that opens with no server and no network: plots of the run, and a token view of\n"
      "the stored samples (run.samples-every)");
  flags_spec.add_options()
      ("folder", po::value<std::string>()->value_name("DIR")->required(), "the run folder (also the first positional)")
      ("output", po::value<std::string>()->value_name("FILE"), "write here instead of RUN_FOLDER/report.html")
      ("sample-steps", po::value<int64_t>()->value_name("N")->default_value(8), "the token view holds the latest N steps with samples; 0 = all")
      ("help", "print this help");
  po::positional_options_description positional;
  positional.add("folder", 1);
  po::variables_map flags;
  if (const auto status = parse_command_flags("report", argc, argv, flags_spec, flags, out, err, positional))
    return *status;
  const std::filesystem::path folder = flags["folder"].as<std::string>();
  if (!std::filesystem::is_regular_file(folder / kRunFileName)) {
    err << "tandem report: " << (folder / kRunFileName).string() << ": no such file (give a run folder)\n";
    return 2;
  }
  try {
    ReportSettings settings;
    settings.sample_steps = flags["sample-steps"].as<int64_t>();
    if (flags.count("output")) settings.output = flags["output"].as<std::string>();
    const std::filesystem::path written = write_report(folder, settings);
    out << written.string() << "\n";
  } catch (const std::exception& e) {
    err << "tandem report: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace tandem
