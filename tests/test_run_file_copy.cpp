// The pieces of a restart that loses nothing: the run file's copy per checkpoint and its
// restore, the keys a deck changed, and the finite check of loaded tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "deck/deck.h"
#include "deck/deck_diff.h"
#include "io/run_file_copy.h"
#include "support.h"
#include "tensor/finite.h"

using namespace tandem;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

RunFile run_with_rows(const fs::path& folder, int64_t rows) {
  const RunFile run = RunFile::create(folder / kRunFileName, RunInfo{"[run]\n", "v", "g", 1, {"cpu @ host"}, "now"});
  for (int64_t step = 1; step <= rows; ++step) run.append_metrics(step, {{"loss", static_cast<double>(step)}});
  return run;
}

}  // namespace

TEST(RunFileCopy, AResumeTruncatesAHealthyRunFile) {
  TempDir dir;
  run_with_rows(dir.path(), 5);
  std::vector<std::string> notes;
  const auto run = resume_run_file(dir.path(), dir / "ckpt_00000003.h5", 3, notes);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->steps(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(notes.empty());
}

TEST(RunFileCopy, AnUnreadableOrShortRunFileIsRestoredFromTheCheckpointsCopy) {
  TempDir dir;
  run_with_rows(dir.path(), 4);
  save_run_file_copy(dir.path(), 4);
  EXPECT_TRUE(fs::exists(dir / "run.ckpt_00000004.h5"));
  fs::resize_file(dir / kRunFileName, fs::file_size(dir / kRunFileName) / 2);  // a write cut short
  std::vector<std::string> notes;
  const auto run = resume_run_file(dir.path(), dir / "ckpt_00000004.h5", 4, notes);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->steps(), (std::vector<int64_t>{1, 2, 3, 4}));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("was restored from " + (dir / "run.ckpt_00000004.h5").string()), std::string::npos) << notes[0];

  // Rows short of the checkpoint's step (a row lost before the commit) are restored too.
  fs::remove(dir / kRunFileName);
  run_with_rows(dir.path(), 2);
  notes.clear();
  EXPECT_EQ(resume_run_file(dir.path(), dir / "ckpt_00000004.h5", 4, notes)->steps().size(), 4u);
  EXPECT_NE(notes.at(0).find("its last row is step 2, not 4"), std::string::npos) << notes[0];

  // Neither usable: an error naming both, not a fresh record.
  fs::resize_file(dir / kRunFileName, 100);
  fs::resize_file(dir / "run.ckpt_00000004.h5", 100);
  EXPECT_THROW(resume_run_file(dir.path(), dir / "ckpt_00000004.h5", 4, notes), std::runtime_error);
  // No run file and no copy: the caller starts a new record.
  fs::remove(dir / kRunFileName);
  fs::remove(dir / "run.ckpt_00000004.h5");
  EXPECT_FALSE(resume_run_file(dir.path(), dir / "ckpt_00000004.h5", 4, notes));
}

TEST(DeckDiff, NamesEachChangedKeyWithBothValues) {
  const Deck before = Deck::load_text("[run]\nsteps = 4\n", "a", {});
  const Deck after = Deck::load_text("[run]\nsteps = 6\n", "b", {"--grpo.lr=0.5", "--run.output-dir=/a/very/long/path/that/reaches/past/the/comment/column"});
  EXPECT_EQ(changed_deck_keys(before.resolved_text(), after.resolved_text()),
            (std::vector<std::string>{"run.output-dir: runs -> /a/very/long/path/that/reaches/past/the/comment/column",
                                      "run.steps: 4 -> 6",
                                      "grpo.lr: 0.002 -> 0.5"}));
  EXPECT_TRUE(changed_deck_keys(after.resolved_text(), after.resolved_text()).empty());
  EXPECT_EQ(changed_deck_keys("[run]\nold = 1 # default\n", "[run]\nnew = 2 # default\n"),
            (std::vector<std::string>{"run.new: (absent) -> 2", "run.old: 1 -> (absent)"}));
}

TEST(Finite, FindsTheFirstNanOrInfinityInEveryFloatingDtype) {
  std::vector<float> f32 = {1, 2, std::numeric_limits<float>::infinity(), NAN};
  EXPECT_EQ(first_non_finite(Tensor::view(f32.data(), DType::F32, Device::CPU, {4})), 2);
  EXPECT_EQ(describe_non_finite(Tensor::view(f32.data(), DType::F32, Device::CPU, {2, 2})), "element 2 of [2,2] is +Inf");
  std::vector<double> f64 = {0, -std::numeric_limits<double>::infinity()};
  EXPECT_EQ(describe_non_finite(Tensor::view(f64.data(), DType::F64, Device::CPU, {2})), "element 1 of [2] is -Inf");
  std::vector<uint16_t> bf16 = {0x3f80, 0x7fc0}, f16 = {0x3c00, 0x7e00}, finite = {0x3c00, 0x7bff};
  EXPECT_EQ(describe_non_finite(Tensor::view(bf16.data(), DType::BF16, Device::CPU, {2})), "element 1 of [2] is NaN");
  EXPECT_EQ(describe_non_finite(Tensor::view(f16.data(), DType::F16, Device::CPU, {2})), "element 1 of [2] is NaN");
  EXPECT_FALSE(first_non_finite(Tensor::view(finite.data(), DType::F16, Device::CPU, {2})));  // 65504
  EXPECT_FALSE(first_non_finite(Tensor::view(f16.data(), DType::I16, Device::CPU, {2})));
}
