// Checkpoints off the step's critical path (run.checkpoint-async = true): at a checkpoint
// step the loop copies the trainer's state (FP32 master weights, the optimizer's
// moments) into a host snapshot beside the step, cursor, deck and every rank's RNG state,
// and goes on; a writer thread writes the file and commits it. The order is the one
// run_file_copy.h states, so the guarantees hold as before:
//   snapshot of step N -> N's metrics row in run.h5 -> run.ckpt_N.h5, durable ->
//   (writer) .ckpt_N.h5.tmp written and fsynced -> renamed into place, folder fsynced
// A committed checkpoint always has its run file's copy, and a kill at any instant leaves
// the previous checkpoint the newest valid one: the file is whole before it has a final
// name (a copy without its checkpoint is pruned). One checkpoint is in flight at a time:
// the next snapshot waits for the writer, as do the job's end and a stop; an exception
// abandons the write (the temporary is removed, nothing is published).
//
// Memory: the snapshot is one host copy of the master weights and the optimizer's state
// (12 bytes a parameter under AdamW), pinned on CUDA so the copy runs at the bus's rate,
// held on rank 0 from the first checkpoint to the job's end. With run.checkpoint-async =
// false it is allocated for each checkpoint only and the file is written before the step
// goes on, as a checkpoint always was.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "driver/trainer_checkpoint.h"
#include "io/checkpoint.h"
#include "world/pinned_memory.h"

namespace tandem {

struct CheckpointWriterSettings {
  std::filesystem::path folder;
  int keep_last = 3;
  bool background = true;  // run.checkpoint-async
  bool root = true;         // trainer rank 0, which holds the snapshot and writes the file
};

class CheckpointWriter {
 public:
  CheckpointWriter(CheckpointWriterSettings settings, const TrainerCheckpoint& trainer, Device device);
  // Abandons a checkpoint in flight: it is never published.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Rank 0 of a background writer: starts allocating the snapshot's pinned buffer on a
  // thread of its own (GBs at the 0.6B shape), so that the first checkpoint finds it
  // ready instead of paying for it. The job calls it once the start-up handoff is done, so
  // the allocation runs beside the first rollout. Elsewhere it does nothing.
  void prepare_snapshot();
  // Collective over the trainer ranks (their optimizer shards are gathered into rank 0's
  // snapshot). Rank 0 waits for the checkpoint in flight (rethrowing its failure), then
  // takes the snapshot of this step; without `background` also writes it under its
  // temporary name. The others only send their shards.
  void snapshot(int64_t step, int64_t data_cursor, const std::string& deck_text, std::vector<std::string> rng_states);
  // After the snapshot's step is in run.h5: the run file's copy of that step, then the
  // checkpoint written (when in the background) and committed.
  void publish();
  // Waits for the checkpoint in flight; rethrows its failure.
  void wait();
  bool in_flight() const { return thread_.joinable(); }

  // The newest committed checkpoint's path, empty until one is (after wait()).
  const std::string& last_committed() const { return last_committed_; }
  // The seconds the writer took for a background checkpoint that has finished since the
  // last call (the thread is joined then), else nothing; rethrows its failure.
  std::optional<double> take_finished_write();
  // The longest a background write took so far (0 before the first, and without
  // `background`, where the step itself waits for the write).
  double longest_background_write_seconds() const { return longest_write_; }

 private:
  void join();
  size_t snapshot_bytes() const;

  CheckpointWriterSettings settings_;
  const TrainerCheckpoint& trainer_;
  Device device_;
  std::unique_ptr<PinnedMemory> buffer_;
  std::future<std::unique_ptr<PinnedMemory>> preparing_;  // buffer_ while prepare_snapshot's thread allocates it
  CheckpointContents contents_;
  bool snapshot_pending_ = false;
  std::jthread thread_;
  std::atomic<bool> finished_{false};
  std::exception_ptr failure_;
  double write_seconds_ = 0, longest_write_ = 0;
  bool write_reported_ = true;
  std::string committed_in_thread_, last_committed_;
};

}  // namespace tandem
