#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <sstream>

#include "deck/deck.h"
#include "deck/options.h"
#include "support.h"

using namespace tandem;
using tandem::testing::TempDir;
using tandem::testing::write_text;

namespace {

DeckError deck_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const DeckError& error) {
    return error;
  }
  ADD_FAILURE() << "the deck was accepted";
  return DeckError("", 0, "", "");
}

DeckError text_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return deck_error([&] { Deck::load_text(text, "test.deck", overrides); });
}

void expect_error(const DeckError& error, const std::string& file, int line, const std::string& key,
                  const std::vector<std::string>& reason_parts) {
  EXPECT_EQ(error.file, file) << error.what();
  EXPECT_EQ(error.line, line) << error.what();
  EXPECT_EQ(error.key, key) << error.what();
  for (const std::string& part : reason_parts) EXPECT_NE(error.reason.find(part), std::string::npos) << error.what() << "\n lacks: " << part;
}

// A schema with a size and a duration, which tandem's own table does not use yet.
const DeckSchema& unit_schema() {
  static const DeckSchema schema{{
      {"pool.size", OptionType::Bytes, "1GiB", "bytes", "pool size", at_least(4096)},
      {"pool.timeout", OptionType::Seconds, "30s", "s", "how long to wait", between(0, 3600)},
  }, {}};
  return schema;
}

}  // namespace

TEST(Deck, EmptyDeckGivesEveryDefault) {
  const Deck deck = Deck::load_text("", "empty.deck", {});
  EXPECT_EQ(deck.get<std::string>("run.name"), "default");
  EXPECT_EQ(deck.get<std::string>("run.output-dir"), "runs");
  EXPECT_EQ(deck.get<int64_t>("run.seed"), 1234);
  EXPECT_EQ(deck.get<int64_t>("run.steps"), 20);
  EXPECT_EQ(deck.get<std::string>("run.restart"), "auto");
  EXPECT_EQ(deck.get<int64_t>("run.checkpoint-every"), 5);
  EXPECT_EQ(deck.get<int64_t>("run.keep-checkpoints"), 3);
  EXPECT_EQ(deck.get<std::string>("world.device"), "auto");
  EXPECT_EQ(deck.get<std::string>("world.log-level"), "info");
  EXPECT_FALSE(deck.get<bool>("world.log-all-ranks"));
  EXPECT_EQ(deck.get<int64_t>("world.threads"), 0);
  EXPECT_TRUE(deck.get<bool>("memory.offload-train"));
  EXPECT_TRUE(deck.get<bool>("memory.offload-rollout"));
  EXPECT_EQ(deck.get<std::vector<std::string>>("memory.offload-rollout-level"), (std::vector<std::string>{"kv_cache", "weight"}));
  EXPECT_EQ(deck.get<std::string>("memory.colocate-memory-peak-device"), "cpu");
  EXPECT_TRUE(deck.get<bool>("memory.pinned-host-cache"));
  EXPECT_EQ(deck.get<std::string>("model.path"), "");
  EXPECT_EQ(deck.get<int64_t>("model.layers"), 2);
  EXPECT_EQ(deck.get<int64_t>("model.hidden"), 64);
  EXPECT_EQ(deck.get<int64_t>("model.heads"), 4);
  EXPECT_EQ(deck.get<int64_t>("model.kv-heads"), 2);
  EXPECT_EQ(deck.get<int64_t>("model.head-dim"), 16);
  EXPECT_EQ(deck.get<int64_t>("model.intermediate"), 128);
  EXPECT_EQ(deck.get<int64_t>("model.vocab"), 64);
  EXPECT_TRUE(deck.get<bool>("model.tie-embeddings"));
  EXPECT_DOUBLE_EQ(deck.get<double>("model.rope-theta"), 10000);
  EXPECT_DOUBLE_EQ(deck.get<double>("model.rms-eps"), 1e-6);
  EXPECT_TRUE(deck.get<bool>("model.qk-norm"));
  EXPECT_EQ(deck.get<std::string>("model.dtype"), "bf16");
  for (const OptionSpec& spec : tandem_options()) EXPECT_TRUE(deck.is_default(spec.key)) << spec.key;
}

TEST(Deck, ReadsCommentsBlankLinesAndSourcesFromAFile) {
  TempDir dir;
  write_text(dir / "good.deck",
             "# a small run\n"
             "\n"
             "[run]\n"
             "name = trial-7   # trailing comment\n"
             "   steps=  12\n"
             "\r\n"
             "[memory]\n"
             "offload-rollout-level = weight\n"
             "[model]\n"
             "rms-eps = 1e-5\n"
             "qk-norm = off\r\n");
  const Deck deck = Deck::load_file((dir / "good.deck").string(), {});
  EXPECT_EQ(deck.get<std::string>("run.name"), "trial-7");
  EXPECT_EQ(deck.get<int64_t>("run.steps"), 12);
  EXPECT_EQ(deck.get<std::vector<std::string>>("memory.offload-rollout-level"), std::vector<std::string>{"weight"});
  EXPECT_DOUBLE_EQ(deck.get<double>("model.rms-eps"), 1e-5);
  EXPECT_FALSE(deck.get<bool>("model.qk-norm"));
  EXPECT_FALSE(deck.is_default("run.steps"));
  EXPECT_TRUE(deck.is_default("run.seed"));
  EXPECT_EQ(deck.source("run.steps").describe(), (dir / "good.deck").string() + ":5");
  EXPECT_EQ(deck.source("model.qk-norm").line, 11);
  EXPECT_EQ(deck.source("run.seed").describe(), "default");
}

TEST(Deck, BooleansAcceptEverySpelling) {
  for (const char* yes : {"true", "yes", "on", "1", "TRUE", "Yes"})
    EXPECT_TRUE(Deck::load_text(std::string("[world]\nlog-all-ranks = ") + yes, "t", {}).get<bool>("world.log-all-ranks")) << yes;
  for (const char* no : {"false", "no", "off", "0", "False"})
    EXPECT_FALSE(Deck::load_text(std::string("[model]\nqk-norm = ") + no, "t", {}).get<bool>("model.qk-norm")) << no;
}

TEST(Deck, SizesAndDurationsTakeUnits) {
  const Deck deck = Deck::load_text("[pool]\nsize = 1.5GiB\ntimeout = 5min\n", "t", {}, unit_schema());
  EXPECT_EQ(deck.get<Bytes>("pool.size").value, 1610612736u);
  EXPECT_DOUBLE_EQ(deck.get<Seconds>("pool.timeout").value, 300);
  EXPECT_EQ(deck.text("pool.size"), "1536MiB");
}

TEST(Deck, CommandLineOverridesWinOverTheFileAndLaterOverEarlier) {
  const Deck deck = Deck::load_text("[run]\nsteps = 12\nseed = 7\n", "t.deck",
                                    {"--run.steps=5", "--world.device=cpu", "--run.seed=8", "--run.seed= 9 "});
  EXPECT_EQ(deck.get<int64_t>("run.steps"), 5);
  EXPECT_EQ(deck.get<int64_t>("run.seed"), 9);
  EXPECT_EQ(deck.get<std::string>("world.device"), "cpu");
  EXPECT_EQ(deck.source("run.steps").kind, Source::Kind::CommandLine);
  EXPECT_EQ(deck.source("run.steps").describe(), "command line");
}

TEST(Deck, GetRefusesTheWrongTypeAndUnknownKeys) {
  const Deck deck = Deck::load_text("", "t", {});
  EXPECT_THROW(deck.get<double>("run.steps"), std::invalid_argument);
  EXPECT_THROW(deck.get<int64_t>("run.nope"), std::invalid_argument);
}

TEST(DeckErrors, UnknownKeySuggestsTheNearest) {
  const DeckError error = text_error("[run]\n\nstpes = 5\n");
  expect_error(error, "test.deck", 3, "run.stpes", {"unknown key", "did you mean 'run.steps'?"});
  EXPECT_STREQ(error.what(), "test.deck:3: key 'run.stpes': unknown key (did you mean 'run.steps'?)");
  // The right name in the wrong section.
  expect_error(text_error("[run]\ndevice = cpu\n"), "test.deck", 2, "run.device", {"did you mean 'world.device'?"});
  // A key outside every section.
  expect_error(text_error("steps = 3\n"), "test.deck", 1, "steps", {"did you mean 'run.steps'?"});
  // Nothing close: no misleading suggestion.
  const DeckError far = text_error("[model]\nflux-capacitor = 1\n");
  expect_error(far, "test.deck", 2, "model.flux-capacitor", {"unknown key", "tandem --help"});
  EXPECT_EQ(far.reason.find("did you mean"), std::string::npos) << far.what();
}

TEST(DeckErrors, UnknownSectionSuggestsTheNearest) {
  const DeckError error = text_error("# header\n[rnu]\nsteps = 5\n");
  expect_error(error, "test.deck", 2, "", {"unknown section [rnu]", "did you mean [run]?"});
  EXPECT_STREQ(error.what(), "test.deck:2: unknown section [rnu] (did you mean [run]?)");
  expect_error(text_error("[zzzzzzzzzz]\n"), "test.deck", 1, "", {"unknown section [zzzzzzzzzz]", "[run], [world], [memory], [sync], [rollout], [task], [grpo], [sft], [train], [model]"});
}

TEST(DeckErrors, MalformedLinesNameTheLine) {
  expect_error(text_error("[run]\nsteps 5\n"), "test.deck", 2, "", {"malformed line 'steps 5'", "key = value"});
  expect_error(text_error("[run]\nsteps = 5\n= 5\n"), "test.deck", 3, "", {"malformed line", "no key before '='"});
  expect_error(text_error("[run\n"), "test.deck", 1, "", {"malformed section header '[run'"});
  expect_error(text_error("[]\n"), "test.deck", 1, "", {"malformed section header '[]'"});
  expect_error(text_error("[run]\nmy steps = 5\n"), "test.deck", 2, "", {"key 'my steps'", "letters, digits"});
}

TEST(DeckErrors, BadTypeSaysWhatWasExpected) {
  expect_error(text_error("[run]\nsteps = many\n"), "test.deck", 2, "run.steps", {"expected an integer, got 'many'"});
  expect_error(text_error("[run]\nsteps = 2.5\n"), "test.deck", 2, "run.steps", {"expected an integer, got '2.5'"});
  expect_error(text_error("[world]\nlog-all-ranks = maybe\n"), "test.deck", 2, "world.log-all-ranks", {"expected a boolean", "yes/no", "got 'maybe'"});
  expect_error(text_error("[model]\nrope-theta = big\n"), "test.deck", 2, "model.rope-theta", {"expected a number, got 'big'"});
  expect_error(text_error("[model]\nrope-theta = nan\n"), "test.deck", 2, "model.rope-theta", {"finite"});
  expect_error(text_error("[run]\nsteps =\n"), "test.deck", 2, "run.steps", {"empty value"});
  expect_error(text_error("[world]\ndevice = gpu\n"), "test.deck", 2, "world.device", {"expected one of auto, cpu, cuda, got 'gpu'"});
  expect_error(text_error("[memory]\noffload-rollout-level = kv_cache,weights\n"), "test.deck", 2, "memory.offload-rollout-level",
               {"expected one of kv_cache, weight", "'weights'"});
  expect_error(text_error("[memory]\noffload-rollout-level = weight,weight\n"), "test.deck", 2, "memory.offload-rollout-level", {"listed twice"});
  expect_error(text_error("[memory]\noffload-rollout-level = weight,\n"), "test.deck", 2, "memory.offload-rollout-level", {"empty item"});
}

TEST(DeckErrors, BadUnitNamesTheAcceptedUnits) {
  const DeckError size = deck_error([] { Deck::load_text("[pool]\nsize = 4XB\n", "units.deck", {}, unit_schema()); });
  expect_error(size, "units.deck", 2, "pool.size", {"unknown unit 'XB'", "KiB", "GiB", "TiB"});
  const DeckError time = deck_error([] { Deck::load_text("[pool]\n\ntimeout = 3 days\n", "units.deck", {}, unit_schema()); });
  expect_error(time, "units.deck", 3, "pool.timeout", {"unknown unit 'days'", "ms, s, min, h"});
}

TEST(DeckErrors, OutOfRangeStatesTheRange) {
  expect_error(text_error("[model]\nlayers = 600\n"), "test.deck", 2, "model.layers", {"out of range: need 1 <= value <= 512, got 600"});
  expect_error(text_error("[run]\nsteps = -1\n"), "test.deck", 2, "run.steps", {"out of range: need value >= 0, got -1"});
  expect_error(text_error("[model]\nrms-eps = 0\n"), "test.deck", 2, "model.rms-eps", {"out of range: need value > 0, got 0"});
  const DeckError size = deck_error([] { Deck::load_text("[pool]\nsize = 1KiB\n", "u", {}, unit_schema()); });
  expect_error(size, "u", 2, "pool.size", {"need value >= 4KiB, got 1KiB"});
}

TEST(DeckErrors, MissingFilesNameThePath) {
  TempDir dir;
  const std::string deck_path = (dir / "absent.deck").string();
  const DeckError deck = deck_error([&] { Deck::load_file(deck_path, {}); });
  expect_error(deck, deck_path, 0, "", {"missing file"});
  EXPECT_EQ(std::string(deck.what()), deck_path + ": missing file: the deck does not exist");
  expect_error(deck_error([&] { Deck::load_file(dir.path().string(), {}); }), dir.path().string(), 0, "", {"folder"});

  // A task's prompt file must exist; a model folder is read at start-up only (it may be
  // visible to the compute nodes alone), so a deck naming an absent one still checks.
  const std::string prompts = (dir / "none.jsonl").string();
  expect_error(text_error("[task]\npath = " + prompts + "\n"), "test.deck", 2, "task.path", {"missing file", prompts});
  const std::string model = (dir / "no-model").string();
  EXPECT_EQ(Deck::load_text("[model]\npath = " + model, "t", {}).get<std::string>("model.path"), model);
}

TEST(DeckErrors, DuplicateKeyNamesBothLines) {
  const DeckError error = text_error("[run]\nsteps = 5\nseed = 1\n\nsteps = 6\n");
  expect_error(error, "test.deck", 5, "run.steps", {"set twice, on lines 2 and 5"});
}

TEST(DeckErrors, BadOverridesNameTheCommandLine) {
  const DeckError type = text_error("", {"--run.steps=abc"});
  expect_error(type, "command line", 0, "run.steps", {"expected an integer, got 'abc'"});
  EXPECT_STREQ(type.what(), "command line: key 'run.steps': expected an integer, got 'abc'");
  expect_error(text_error("", {"--run.stpes=5"}), "command line", 0, "run.stpes", {"did you mean 'run.steps'?"});
  expect_error(text_error("", {"--rnu.steps=5"}), "command line", 0, "rnu.steps", {"unknown section [rnu]", "[run]"});
  expect_error(text_error("", {"run.steps=5"}), "command line", 0, "", {"malformed override 'run.steps=5'", "--section.key=value"});
  expect_error(text_error("", {"--run.steps"}), "command line", 0, "", {"malformed override"});
  expect_error(text_error("", {"--run.steps="}), "command line", 0, "run.steps", {"empty value"});
  expect_error(text_error("", {"--run.name=a#b"}), "command line", 0, "run.name", {"'#'"});
  expect_error(text_error("", {"--model.layers=0"}), "command line", 0, "model.layers", {"out of range"});
}

TEST(DeckRules, GpuPeakNeedsBothOffloads) {
  const DeckError error = text_error("[memory]\ncolocate-memory-peak-device = gpu\noffload-train = false\n");
  expect_error(error, "test.deck", 3, "memory.offload-train",
               {"needs offload-train = true and offload-rollout = true", "memory.colocate-memory-peak-device = gpu (test.deck:2)",
                "memory.offload-train = false (test.deck:3)"});
  expect_error(text_error("[memory]\ncolocate-memory-peak-device = gpu\n", {"--memory.offload-rollout=no"}), "command line", 0,
               "memory.offload-rollout", {"needs offload-train = true"});
  EXPECT_NO_THROW(Deck::load_text("[memory]\ncolocate-memory-peak-device = gpu\n", "t", {}));
  EXPECT_NO_THROW(Deck::load_text("[memory]\noffload-train = false\n", "t", {}));
}

TEST(DeckRules, HeadsDivisibleByKvHeads) {
  expect_error(text_error("[model]\nheads = 6\nkv-heads = 4\n"), "test.deck", 3, "model.kv-heads",
               {"model.heads must be divisible by model.kv-heads", "model.heads = 6", "model.kv-heads = 4"});
  expect_error(text_error("[model]\nheads = 5\n"), "test.deck", 2, "model.heads", {"divisible", "model.kv-heads = 2 (default)"});
  EXPECT_NO_THROW(Deck::load_text("[model]\nheads = 8\nkv-heads = 8\n", "t", {}));
}

TEST(DeckRules, OverSamplingServesDynamicSamplingWithRoundsThatHoldTheBatch) {
  expect_error(text_error("[grpo]\nover-sampling-groups = 32\n"), "test.deck", 2, "grpo.over-sampling-groups",
               {"set grpo.dynamic-sampling = true", "grpo.dynamic-sampling = false (default)"});
  expect_error(text_error("[grpo]\ndynamic-sampling = true\nover-sampling-groups = 8\n"), "test.deck", 3,
               "grpo.over-sampling-groups", {"must hold the rank's batch", "task.prompts-per-step = 16 (default)"});
  EXPECT_NO_THROW(Deck::load_text("[grpo]\ndynamic-sampling = true\nover-sampling-groups = 16\n", "t", {}));
}

TEST(DeckRules, RestartIsAutoNeverOrAnExistingCheckpoint) {
  TempDir dir;
  const std::string checkpoint = (dir / "step-000010.h5").string();
  expect_error(text_error("[run]\nrestart = " + checkpoint + "\n"), "test.deck", 2, "run.restart",
               {"missing file '" + checkpoint + "'", "auto, never"});
  expect_error(text_error("", {"--run.restart=" + dir.path().string()}), "command line", 0, "run.restart", {"is a folder"});
  write_text(checkpoint, "checkpoint");
  EXPECT_EQ(Deck::load_text("[run]\nrestart = " + checkpoint, "t", {}).get<std::string>("run.restart"), checkpoint);
  EXPECT_NO_THROW(Deck::load_text("[run]\nrestart = never", "t", {}));
}

TEST(Deck, ResolvedTextSaysWhereEachValueCameFromAndParsesBack) {
  TempDir dir;
  write_text(dir / "x.deck", "[run]\nname = resolved\n[memory]\noffload-rollout-level = weight, kv_cache\n[model]\nrms-eps = 2.5e-7\n");
  const Deck deck = Deck::load_file((dir / "x.deck").string(), {"--model.rope-theta=500000", "--world.log-all-ranks=yes"});
  const std::string text = deck.resolved_text();
  const std::string file = (dir / "x.deck").string();
  EXPECT_NE(text.find("[run]\nname = resolved"), std::string::npos) << text;
  EXPECT_NE(text.find("# " + file + ":2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rope-theta = 500000"), std::string::npos) << text;
  EXPECT_NE(text.find("# command line\n"), std::string::npos) << text;
  EXPECT_NE(text.find("steps = 20"), std::string::npos) << text;
  EXPECT_NE(text.find("# default\n"), std::string::npos) << text;

  const Deck again = Deck::load_text(text, "resolved.deck", {});
  for (const OptionSpec& spec : tandem_options()) {
    EXPECT_EQ(again.text(spec.key), deck.text(spec.key)) << spec.key;
    EXPECT_FALSE(again.is_default(spec.key)) << spec.key;
  }
  EXPECT_EQ(again.get<std::vector<std::string>>("memory.offload-rollout-level"), (std::vector<std::string>{"weight", "kv_cache"}));
  EXPECT_EQ(again.get<double>("model.rms-eps"), 2.5e-7);
  EXPECT_EQ(again.get<bool>("world.log-all-ranks"), true);

  const Deck units = Deck::load_text("[pool]\nsize = 1.5GiB\ntimeout = 250ms\n", "u", {}, unit_schema());
  const Deck units_again = Deck::load_text(units.resolved_text(), "u2", {}, unit_schema());
  EXPECT_EQ(units_again.get<Bytes>("pool.size"), units.get<Bytes>("pool.size"));
  EXPECT_EQ(units_again.get<Seconds>("pool.timeout"), units.get<Seconds>("pool.timeout"));
}

TEST(Deck, HelpListsEveryOptionUnderItsSection) {
  std::ostringstream out;
  print_deck_help(out);
  const std::string help = out.str();
  for (const OptionSpec& spec : tandem_options()) {
    const size_t header = help.find("\n[" + spec.section() + "]\n");
    const size_t entry = help.find("\n  " + spec.name() + " = " + spec.default_text + " ", header);
    ASSERT_NE(header, std::string::npos) << spec.section();
    ASSERT_NE(entry, std::string::npos) << spec.key;
    const size_t next_section = help.find("\n[", header + 1);
    EXPECT_LT(entry, next_section) << spec.key << " is not under [" << spec.section() << "]";
    const size_t help_line = help.find("\n      " + spec.help + "\n", entry);
    EXPECT_NE(help_line, std::string::npos) << spec.key;
    EXPECT_LT(help_line, help.find("\n  ", entry + 1) == std::string::npos ? help.size() : help.find("\n  ", entry + 1) + 1) << spec.key;
  }
  EXPECT_NE(help.find("  layers = 2 "), std::string::npos);
  EXPECT_NE(help.find("int, 1 <= value <= 512"), std::string::npos) << help;
  EXPECT_NE(help.find("auto|cpu|cuda"), std::string::npos) << help;
  EXPECT_NE(help.find("int, value >= 0, in steps"), std::string::npos) << help;
}

TEST(Deck, ShippedExampleDecksLoad) {
  for (const auto& file : std::filesystem::directory_iterator(tandem::testing::source_dir() / "inputs")) {
    if (file.path().extension() != ".deck") continue;
    EXPECT_NO_THROW(Deck::load_file(file.path().string(), {})) << file.path();
  }
  EXPECT_EQ(Deck::load_file((tandem::testing::source_dir() / "inputs" / "tiny.deck").string(), {}).get<std::string>("run.name"), "tiny");
}
