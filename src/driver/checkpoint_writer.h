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
// With the optimizer state on disk (optimizer.state = disk), each checkpoint is followed
// by an msync of this rank's state file, so that its dirty pages reach the disk (and
// become reclaimable) at a bounded rate instead of piling up; in the background mode it
// runs on the writer's thread after the commit, every rank, off the step. It is not what
// makes a checkpoint restartable: the snapshot holds the state, and the state file is
// scratch, created anew at every start and filled from the checkpoint.
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
#include "train/optimizer_state_file.h"
#include "world/pinned_memory.h"

namespace tandem {

struct CheckpointWriterSettings {
  std::filesystem::path folder;
  int keep_last = 3;
  bool background = true;  // run.checkpoint-async
  bool root = true;         // trainer rank 0, which holds the snapshot and writes the file
  OptimizerStateFile* state_file = nullptr;  // this rank's, msynced after each checkpoint; outlives the writer
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
  // snapshot). Every rank waits for its checkpoint work in flight (rethrowing its
  // failure). Rank 0 then takes the snapshot of this step; the others send their shards.
  // Without `background`, rank 0 also writes the snapshot under its temporary name, and
  // every rank msyncs its state file; in the background, the others start that msync.
  void snapshot(int64_t step, int64_t data_cursor, const std::string& deck_text, std::vector<std::string> rng_states);
  // Rank 0, after the snapshot's step is in run.h5: the run file's copy of that step,
  // then the checkpoint written (when in the background) and committed.
  void publish();
  // Waits for the checkpoint work in flight; rethrows its failure.
  void wait();
  bool in_flight() const { return thread_.joinable(); }

  // The newest committed checkpoint's path, empty until one is (after wait()).
  const std::string& last_committed() const { return last_committed_; }
  // What a checkpoint's work took, in the background or not.
  struct Times {
    double write_seconds = 0;                   // rank 0: the write of the file (and its commit, in the background)
    std::optional<double> state_msync_seconds;  // with a state file: its msync
  };
  // The times of a checkpoint whose work has ended since the last call (a background
  // thread is joined then), else nothing; rethrows its failure.
  std::optional<Times> take_finished();
  // The longest a background checkpoint's work took so far, msync included (0 before the
  // first, and without `background`, where the step itself waits for it).
  double longest_background_seconds() const { return longest_background_; }

 private:
  void join();
  size_t snapshot_bytes() const;
  // The work of the checkpoint snapshotted last, on a thread of its own: rank 0's write
  // and commit when `write`, then the state file's msync.
  void start_background(bool write);
  void sync_state_file();

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
  Times times_;
  double background_seconds_ = 0, longest_background_ = 0;
  bool times_reported_ = true;
  std::string committed_in_thread_, last_committed_;
};

}  // namespace tandem
