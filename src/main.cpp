// tandem: GRPO post-training of language models as one MPI batch application.
//
//   tandem [DECK] [--section.key=value ...]   run a job (no DECK: the embedded default)
//   tandem --check DECK [overrides]           validate and print the resolved deck
//   tandem --help | --version
//   tandem tokenize --tokenizer PATH [--decode]
//   tandem generate --model HF_DIR|CKPT --prompt TEXT [...]
//   tandem inspect FILE [--json] [--verify]
//   tandem report RUN_FOLDER
//   tandem export CKPT --hf OUT [--dtype bf16|f32]
#include <mpi.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "deck/deck.h"
#include "deck/same_deck_on_ranks.h"
#include "driver/default_deck.h"
#include "driver/run_deck_schema.h"
#include "driver/run_job.h"
#include "export/export_command.h"
#include "inspect/inspect_command.h"
#include "report/report_command.h"
#include "rollout/generate_command.h"
#include "tasks/tokenize_command.h"
#include "world/errors.h"
#include "world/stop_signals.h"
#include "world/version.h"
#include "world/world.h"

namespace {

void print_usage(std::ostream& out) {
  out << "tandem " << tandem::tandem_version() << " (" << tandem::tandem_git_revision() << ")\n"
      << "GRPO post-training of language-model policies, one MPI rank per GPU.\n\n"
      << "usage:\n"
      << "  mpirun -np N tandem [DECK] [--section.key=value ...]   run a job (no DECK: the embedded default)\n"
      << "  tandem --check DECK [--section.key=value ...]          validate, print the resolved deck, exit\n"
      << "  tandem tokenize --tokenizer PATH [--decode]           text lines on stdin -> token ids (or back)\n"
      << "  tandem generate --model HF_DIR|CKPT --prompt TEXT [--max-new N] [--temperature T] [--top-p P]\n"
      << "                  [--top-k K] [--seed S] [--chat] [--ids]     complete a prompt (temperature 0: greedy)\n"
      << "  tandem inspect FILE [--metrics A,B] [--last N] [--csv] [--json] [--verify]\n"
      << "                  what a run file or checkpoint holds (--help: details)\n"
      << "  tandem report RUN_FOLDER                               write RUN_FOLDER/report.html: plots and token view\n"
      << "  tandem export CKPT --hf OUT [--dtype bf16|f32]         a checkpoint's policy as a Hugging Face folder\n"
      << "  tandem --help | --version\n\n"
      << "Deck options (file: [section] then key = value; command line: --section.key=value):\n";
}

struct Arguments {
  bool check = false;
  std::string deck_path;  // empty: the embedded default deck
  std::vector<std::string> overrides;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check")
      args.check = true;
    else if (arg.rfind("--", 0) == 0)
      args.overrides.push_back(arg);
    else if (args.deck_path.empty())
      args.deck_path = arg;
    else
      throw tandem::DeckError("command line", 0, "", "a second deck file '" + arg + "' (give one deck, then --section.key=value overrides)");
  }
  return args;
}

tandem::Deck load_deck(const Arguments& args) {
  if (args.deck_path.empty())
    return tandem::Deck::load_text(tandem::embedded_default_deck(), "<embedded default deck>", args.overrides,
                                   tandem::run_deck_schema());
  return tandem::Deck::load_file(args.deck_path, args.overrides, tandem::run_deck_schema());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2) {
    const std::string first = argv[1];
    if (first == "--help" || first == "-h") {
      print_usage(std::cout);
      tandem::print_deck_help(std::cout);
      return 0;
    }
    if (first == "--version") {
      std::cout << "tandem " << tandem::tandem_version() << " (" << tandem::tandem_git_revision() << ")\n";
      return 0;
    }
    if (first == "tokenize") return tandem::tokenize_command(argc - 1, argv + 1);
    if (first == "generate") return tandem::generate_command(argc - 1, argv + 1);
    if (first == "inspect") return tandem::inspect_command(argc - 1, argv + 1);
    if (first == "report") return tandem::report_command(argc - 1, argv + 1);
    if (first == "export") return tandem::export_command(argc - 1, argv + 1);
  }

  Arguments args;
  try {
    args = parse_arguments(argc, argv);
    if (args.check) {
      // No MPI, no GPU: a check is safe on a login node.
      const tandem::Deck deck = load_deck(args);
      std::cout << deck.resolved_text();
      return 0;
    }
  } catch (const tandem::DeckError& error) {
    std::cerr << "tandem: " << error.what() << "\n";
    return tandem::kExitBadInput;
  }

  // Before MPI_Init: a stop signal that comes early (a requeued job's) must not kill the rank.
  tandem::install_stop_signals();
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = tandem::kExitDone;
  try {
    // Every rank parses its own deck (an MPMD launch may give ranks different ones), so a bad
    // one fails every rank together, and ranks with different decks refuse to start.
    std::optional<tandem::Deck> deck;
    tandem::fail_together_on_error(MPI_COMM_WORLD, [&] { deck.emplace(load_deck(args)); });
    tandem::require_same_deck_on_ranks(MPI_COMM_WORLD, *deck);
    status = tandem::run_job(*deck, MPI_COMM_WORLD);
  } catch (const tandem::RanksFailedError& error) {
    // Every rank threw this one together: each leaves through MPI_Finalize.
    if (rank == 0) std::cerr << "tandem: " << error.what() << "\n";
    status = error.code();
  } catch (const std::exception& error) {
    std::cerr << "tandem: rank " << rank << ": " << error.what() << "\n";
    // A rank failing alone would leave the others waiting in a collective.
    MPI_Abort(MPI_COMM_WORLD, tandem::exit_code_of(error));
  }
  MPI_Finalize();
  return status;
}
