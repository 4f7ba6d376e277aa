// The run file (`runs/<name>/run.h5`): what ran (deck text, version, git revision, ranks,
// the device of each rank) and a metrics table that grows by one row per step.
//
//   /                 attributes format, format_version, version, git_revision, ranks, started_at
//   /deck             the resolved deck, one string
//   /devices          one string per rank
//   /metrics/step     int64, one row per appended step
//   /metrics/<name>   float64, same length; NaN where the metric was not recorded
//   /samples/step_N   rollout samples of some steps (see append_samples)
//   /jobs/job_N       one group per job of the run (see append_job)
//
// h5py users read a column with `f['metrics/reward_mean'][:]`. Every operation opens the
// file, works, flushes and closes it, so the file is only open (and only at risk from a
// crash) for the milliseconds of one append, and readers can open it between appends.
// Other groups (samples) can be added next to /metrics by later code.
// What keeps it resumable through a crash or a full disk: run_file_copy.h.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

inline constexpr const char* kRunFileName = "run.h5";

struct RunInfo {
  std::string deck_text;
  std::string version;
  std::string git_revision;
  int64_t ranks = 0;
  std::vector<std::string> devices;  // one per rank, e.g. "cuda:0 NVIDIA H200 @ node12"
  std::string started_at;            // ISO 8601
};

using MetricValues = std::vector<std::pair<std::string, double>>;

// What one job of a run started from: its resolved deck, and for a restart the
// checkpoint, the keys whose values differ from the checkpoint's deck, and what the
// restart had to work around (a checkpoint passed over, the run file restored).
struct JobRecord {
  std::string started_at;  // ISO 8601
  std::string deck_text;
  std::string resumed_from;  // checkpoint path; empty for a fresh start
  int64_t resumed_step = 0;
  std::vector<std::string> changed_keys;  // "run.steps: 6 -> 8"
  std::vector<std::string> notes;
};

// One rollout sample as the run file keeps it, for the token-level view of a step.
struct SampleRecord {
  std::string prompt_text, completion_text;
  std::vector<int32_t> prompt_tokens, completion_tokens;
  std::vector<float> rollout_logp;  // per completion token, from the engine
  std::vector<float> train_logp;    // per completion token, recomputed by the trainer
  std::vector<float> entropy;       // per completion token, of the trainer's distribution
  std::vector<float> reference_logp;  // per completion token under the KL reference; empty without one
  // The text of each token alone (a piece of a multi-byte character decodes to U+FFFD),
  // so a token view needs no tokenizer.
  std::vector<std::string> prompt_pieces, completion_pieces;
  float advantage = 0;
  double reward = 0;
};

class RunFile {
 public:
  // A new run file; refuses to overwrite an existing one (a restart reopens it instead).
  static RunFile create(const std::filesystem::path& path, const RunInfo& info);
  // An existing run file, checked to be one.
  static RunFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  RunInfo info() const;

  // One row: `step` must be larger than every step already in the table. Metrics absent
  // from `values` get NaN in this row; a metric seen for the first time gets NaN in all
  // earlier rows. Names may be nested ("perf/tokens_per_s"); "step" is reserved.
  void append_metrics(int64_t step, const MetricValues& values) const;

  // For a restart from the checkpoint of `step`: drops the rows of later steps, and the
  // metrics that only those rows recorded, so the table matches an uninterrupted run.
  void truncate_after(int64_t step) const;

  // /samples/step_<8 digits>/: prompt_text, completion_text (strings, one per sample);
  // prompt_tokens, completion_tokens (I32, all samples end to end) with prompt_offsets,
  // completion_offsets (I64 [n+1]); rollout_logp, train_logp (F32, aligned with
  // completion_tokens); advantage (F32 [n]); reward (F64 [n]). Also
  // entropy (F32, like train_logp), reference_logp (only when every sample has it),
  // prompt_pieces, completion_pieces (strings, one per token, aligned with the tokens), and
  // response_mask (U8 with offsets prompt_offsets + completion_offsets: each sample's
  // prompt then completion, 0 for a prompt token, 1 for a response token). Older files,
  // written before these columns, read with them empty.
  void append_samples(int64_t step, const std::vector<SampleRecord>& samples) const;
  std::vector<SampleRecord> samples(int64_t step) const;
  std::vector<int64_t> sample_steps() const;

  // /jobs/job_<4 digits, from 1>/: deck, changed_keys, notes (strings); attributes
  // started_at, resumed_from, resumed_step. Jobs are kept through truncate_after.
  void append_job(const JobRecord& job) const;
  std::vector<JobRecord> jobs() const;

  std::vector<int64_t> steps() const;
  std::vector<std::string> metric_names() const;  // without "step", in name order
  std::vector<double> metric(const std::string& name) const;

 private:
  explicit RunFile(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

}  // namespace tandem
