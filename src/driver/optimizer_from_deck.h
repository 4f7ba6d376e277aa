// The [optimizer] section of a deck as the trainer's typed settings, and the rank's
// state file when the state lives on disk.
#pragma once
#include <mpi.h>

#include <filesystem>
#include <memory>

#include "deck/deck.h"
#include "model/parameters.h"
#include "train/optimizer_settings.h"
#include "train/optimizer_state_file.h"

namespace tandem {
OptimizerSettings optimizer_settings_from_deck(const Deck& deck);
// Null unless optimizer.state = disk. Collective: a rank that cannot create, size or map
// its file makes every rank throw a DeckError (exit code 2) at optimizer.state-path with
// each failing rank's path and bytes.
std::unique_ptr<OptimizerStateFile> optimizer_state_file_from_deck(const Deck& deck, const ParameterLayout& layout,
                                                                   const std::filesystem::path& run_folder,
                                                                   Device device, int rank, MPI_Comm comm);
}
