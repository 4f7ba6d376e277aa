#include "driver/checkpoint_writer.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "io/run_file_copy.h"
#include "world/gpu.h"

namespace tandem {

CheckpointWriter::CheckpointWriter(CheckpointWriterSettings settings, const TrainerCheckpoint& trainer, Device device)
    : settings_(std::move(settings)), trainer_(trainer), device_(device) {}

// Before any member the writer uses goes: write_checkpoint_temporary gives up between
// two tensors and removes its temporary; a failure here has no one to go to.
CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
}

void CheckpointWriter::join() {
  if (!thread_.joinable()) return;
  thread_.join();
  finished_ = false;
  if (!committed_in_thread_.empty()) last_committed_ = std::exchange(committed_in_thread_, "");
  longest_background_ = std::max(longest_background_, background_seconds_);
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void CheckpointWriter::wait() { join(); }

std::optional<CheckpointWriter::Times> CheckpointWriter::take_finished() {
  if (thread_.joinable()) {
    if (!finished_) return std::nullopt;  // still working: its times are not known yet
    join();
  }
  if (times_reported_) return std::nullopt;
  times_reported_ = true;
  return times_;
}

size_t CheckpointWriter::snapshot_bytes() const { return trainer_.host_floats() * sizeof(float); }

void CheckpointWriter::prepare_snapshot() {
  if (!settings_.root || !settings_.background || buffer_ || preparing_.valid()) return;
  // On this thread's GPU: a new thread would register the memory with GPU 0's context.
  const int gpu = device_ == Device::CUDA ? bound_gpu() : -1;
  preparing_ = std::async(std::launch::async, [bytes = snapshot_bytes(), device = device_, gpu] {
    if (gpu >= 0) bind_gpu(gpu);
    return std::make_unique<PinnedMemory>(bytes, device);
  });
}

void CheckpointWriter::snapshot(int64_t step, int64_t data_cursor, const std::string& deck_text,
                                std::vector<std::string> rng_states) {
  join();  // a background checkpoint's times stay for take_finished until the next one starts
  if (!settings_.root) {
    trainer_.gather_into(nullptr);  // this rank's shard goes to rank 0's snapshot
    if (!settings_.state_file) return;
    if (settings_.background) {
      start_background(false);
    } else {
      times_ = {};
      sync_state_file();
      times_reported_ = false;
    }
    return;
  }
  const size_t bytes = snapshot_bytes();
  if (preparing_.valid()) buffer_ = preparing_.get();  // rethrows the allocation's failure
  // Pinned and kept in the background mode (the copy then runs at the bus's rate and
  // pays for the allocation once); plain memory for one checkpoint otherwise.
  if (!buffer_ || buffer_->bytes() != bytes)
    buffer_ = std::make_unique<PinnedMemory>(bytes, settings_.background ? device_ : Device::CPU);
  contents_ = CheckpointContents{step, data_cursor, deck_text, std::move(rng_states), {}};
  trainer_.gather_into(static_cast<float*>(buffer_->data()));
  trainer_.add_to(contents_, static_cast<const float*>(buffer_->data()));
  if (!settings_.background) {
    times_ = {};
    const auto start = std::chrono::steady_clock::now();
    write_checkpoint_temporary(settings_.folder, contents_);
    times_.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    buffer_.reset();
    sync_state_file();
    times_reported_ = false;
  }
  snapshot_pending_ = true;
}

void CheckpointWriter::sync_state_file() {
  if (settings_.state_file) times_.state_msync_seconds = settings_.state_file->sync();
}

void CheckpointWriter::start_background(bool write) {
  times_ = {};
  times_reported_ = false;
  thread_ = std::jthread([this, write](std::stop_token stop) {
    const auto start = std::chrono::steady_clock::now();
    try {
      if (write) {
        write_checkpoint_temporary(settings_.folder, contents_, stop);
        // A stop asked for after the last tensor still publishes: the file is whole.
        committed_in_thread_ = commit_checkpoint(settings_.folder, contents_.step, settings_.keep_last).string();
        times_.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      // After the commit, so the checkpoint does not wait for it; skipped on the way out
      // (the job removes the file).
      if (!stop.stop_requested()) sync_state_file();
    } catch (...) {
      failure_ = std::current_exception();
    }
    background_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    finished_ = true;
  });
}

void CheckpointWriter::publish() {
  if (!snapshot_pending_) return;
  snapshot_pending_ = false;
  save_run_file_copy(settings_.folder, contents_.step);
  if (!settings_.background) {
    last_committed_ = commit_checkpoint(settings_.folder, contents_.step, settings_.keep_last).string();
    return;
  }
  start_background(true);
}

}  // namespace tandem
