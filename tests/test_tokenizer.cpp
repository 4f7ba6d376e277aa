// The byte-level BPE tokenizer against the real Qwen3 tokenizer.json and against small
// hand-made tokenizer files, the character tokenizer, and the `tandem tokenize` command.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/byte_level.h"
#include "tasks/char_tokenizer.h"
#include "tasks/tokenize_command.h"
#include "tasks/utf8_text.h"

namespace tandem {
namespace {

using Ids = std::vector<int32_t>;
namespace fs = std::filesystem;

// The Qwen3 tokenizer files live in the project's shared data, beside the source tree;
// TANDEM_QWEN3_TOKENIZER overrides the folder.
fs::path qwen3_folder() {
  if (const char* folder = std::getenv("TANDEM_QWEN3_TOKENIZER")) return folder;
  return testing::source_dir().parent_path() / "shared/data/qwen3-tokenizer";
}

fs::path fixture(const std::string& name) {
  return testing::source_dir() / "tests/fixtures/tokenizer" / name;
}

// The corpus escapes of tools/fixtures/make_tokenizer_fixture.py: \n \r \t \\ and
// \u{HEX}; any other backslash is literal.
std::string unescape(std::string_view line) {
  std::string text;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char next = i + 1 < line.size() ? line[i + 1] : '\0';
    if (line[i] != '\\') {
      text += line[i];
    } else if (next == 'n' || next == 'r' || next == 't' || next == '\\') {
      text += next == 'n' ? '\n' : next == 'r' ? '\r' : next == 't' ? '\t' : '\\';
      ++i;
    } else if (next == 'u' && i + 2 < line.size() && line[i + 2] == '{' &&
               line.find('}', i) != std::string_view::npos) {
      const std::size_t close = line.find('}', i);
      const std::string hex(line.substr(i + 3, close - i - 3));
      text += utf8::encode(static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
      i = close;
    } else {
      text += line[i];
    }
  }
  return text;
}

std::vector<std::string> read_lines(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> corpus() {
  std::vector<std::string> samples;
  for (const std::string& line : read_lines(fixture("corpus.txt"))) samples.push_back(unescape(line));
  return samples;
}

class Qwen3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::is_regular_file(qwen3_folder() / "tokenizer.json"))
        << "the Qwen3 tokenizer is expected in " << qwen3_folder()
        << " (set TANDEM_QWEN3_TOKENIZER to its folder)";
    tokenizer_ = load_tokenizer(qwen3_folder()).release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static const Tokenizer& tok() { return *tokenizer_; }
  static Tokenizer* tokenizer_;
};
Tokenizer* Qwen3Tokenizer::tokenizer_ = nullptr;

TEST_F(Qwen3Tokenizer, KnownIds) {
  EXPECT_EQ(tok().encode("Hello world"), (Ids{9707, 1879}));
  // The example in shared/data/qwen3-tokenizer/SOURCE.md: digits are split one by one.
  EXPECT_EQ(tok().encode("Hello world, 12+34=46 你好"),
            (Ids{9707, 1879, 11, 220, 16, 17, 10, 18, 19, 28, 19, 21, 220, 108386}));
  EXPECT_EQ(tok().encode(""), Ids{});
}

TEST_F(Qwen3Tokenizer, ContractionsAreCaseInsensitive) {
  // "DON" 84641, "'T" 17323, "I" 40, "'M" 27603, "'m" 2776, "'s" 594, "'S" 13272.
  EXPECT_EQ(tok().encode("DON'T"), (Ids{84641, 17323}));
  EXPECT_EQ(tok().encode("I'M"), (Ids{40, 27603}));
  EXPECT_EQ(tok().encode("I'm"), (Ids{40, 2776}));
  EXPECT_EQ(tok().encode("John's"), (Ids{13079, 594}));
  EXPECT_EQ(tok().encode("John'S"), (Ids{13079, 13272}));
}

TEST_F(Qwen3Tokenizer, WhiteSpaceRuns) {
  // "a  b": the split regex leaves one space to join the next word ("Ġb" 293) and the
  // other alone ("Ġ" 220).
  EXPECT_EQ(tok().encode("a  b"), (Ids{64, 220, 293}));
  EXPECT_EQ(tok().encode("\n\n"), Ids{271});  // "ĊĊ"
  EXPECT_EQ(tok().encode("hi\n"), (Ids{6023, 198}));
}

TEST_F(Qwen3Tokenizer, SpecialTokens) {
  EXPECT_EQ(tok().vocab_size(), 151669);
  EXPECT_EQ(tok().id_of("<|im_start|>"), 151644);
  EXPECT_EQ(tok().id_of("<|im_end|>"), 151645);
  EXPECT_EQ(tok().id_of("Ġworld"), 1879);
  EXPECT_FALSE(tok().find_id("no such token"));
  EXPECT_THROW(tok().id_of("no such token"), std::invalid_argument);
  // From tokenizer_config.json.
  EXPECT_EQ(tok().special_ids().eos, 151645);
  EXPECT_EQ(tok().special_ids().pad, 151643);
  EXPECT_FALSE(tok().special_ids().bos);

  // "user" 872, "Ċ" 198, "hi" 6023.
  EXPECT_EQ(tok().encode("<|im_start|>user\nhi<|im_end|>"),
            (Ids{151644, 872, 198, 6023, 151645}));
  EXPECT_EQ(tok().encode("<|im_start|><|im_end|>"), (Ids{151644, 151645}));
  EXPECT_EQ(tok().encode("<think></think>"), (Ids{151667, 151668}));
  // Near misses are plain text.
  for (const char* text : {"<|IM_START|>", "<|im_start", "<|im_end|"}) {
    for (const int32_t id : tok().encode(text)) EXPECT_LT(id, 151643) << text;
    EXPECT_EQ(tok().decode(tok().encode(text)), text);
  }
}

TEST_F(Qwen3Tokenizer, NormalisesToNfc) {
  EXPECT_EQ(tok().encode("Cafe\u0301"), tok().encode("Caf\u00e9"));
  EXPECT_EQ(tok().encode("\u212b"), tok().encode("\u00c5"));  // Angstrom sign
  EXPECT_EQ(tok().decode(tok().encode("A\u030angstro\u0308m")), "\u00c5ngstr\u00f6m");
  // NFC leaves compatibility characters alone (NFKC would not).
  EXPECT_EQ(tok().decode(tok().encode("\ufb01 \u00b2")), "\ufb01 \u00b2");
}

TEST_F(Qwen3Tokenizer, DecodeOfEncodeIsNfcOfEveryCorpusLine) {
  const auto samples = corpus();
  ASSERT_GT(samples.size(), 100u);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(tok().decode(tok().encode(samples[i])), utf8::nfc(samples[i]))
        << "corpus line " << i + 1;
  }
}

TEST_F(Qwen3Tokenizer, DecodeRepairsPartialCharacters) {
  // "你" is E4 BD A0: three byte tokens, each alone an incomplete character.
  const auto& symbols = byte_level::byte_symbols();
  const Ids bytes{tok().id_of(symbols[0xE4]), tok().id_of(symbols[0xBD]), tok().id_of(symbols[0xA0])};
  EXPECT_EQ(tok().decode(bytes), "\u4f60");
  EXPECT_EQ(tok().decode(Ids{bytes[0], bytes[1]}), "\ufffd");  // one maximal subpart
  EXPECT_EQ(tok().decode(Ids{bytes[1], tok().id_of("a")}), "\ufffda");
}

TEST_F(Qwen3Tokenizer, RejectsBadInput) {
  EXPECT_THROW(tok().encode("bad \xff byte"), std::invalid_argument);
  EXPECT_THROW(tok().decode(Ids{151669}), std::out_of_range);
  EXPECT_THROW(tok().decode(Ids{-1}), std::out_of_range);
}

TEST_F(Qwen3Tokenizer, EncodesFromSeveralThreads) {
  const auto samples = corpus();
  std::vector<Ids> expected;
  for (const auto& sample : samples) expected.push_back(tok().encode(sample));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = 0; i < samples.size(); ++i) {
        mismatches[t] += tok().encode(samples[i]) != expected[i];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// The reference ids made by Hugging Face tokenizers (tools/fixtures/make_tokenizer_fixture.py).
TEST_F(Qwen3Tokenizer, MatchesHuggingFaceOnTheCorpus) {
  if (!fs::exists(fixture("qwen3_ids.txt"))) {
    GTEST_SKIP() << "tests/fixtures/tokenizer/qwen3_ids.txt is not generated yet";
  }
  const auto samples = corpus();
  const auto reference = read_lines(fixture("qwen3_ids.txt"));
  ASSERT_EQ(reference.size(), samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    Ids expected;
    std::istringstream words(reference[i]);
    for (int32_t id; words >> id;) expected.push_back(id);
    EXPECT_EQ(tok().encode(samples[i]), expected) << "corpus line " << i + 1;
  }
}

// ---- Hand-made tokenizer files: the other supported forms and the refusals. ----

// A byte-level vocabulary of the 256 bytes plus the merges given (each merged token is
// added with the next id), in either merges form.
nlohmann::json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                              bool merges_as_arrays) {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& symbols = byte_level::byte_symbols();
  for (int b = 0; b < 256; ++b) vocab[symbols[b]] = b;
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [left, right] : merges) {
    const std::string l = byte_level::to_symbols(left), r = byte_level::to_symbols(right);
    if (!vocab.contains(l + r)) vocab[l + r] = static_cast<int>(vocab.size());
    merge_list.push_back(merges_as_arrays ? nlohmann::json::array({l, r}) : nlohmann::json(l + " " + r));
  }
  return {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab},
        {"merges", merge_list}}},
  };
}

std::unique_ptr<Tokenizer> load_json(const testing::TempDir& dir, const nlohmann::json& json) {
  testing::write_text(dir / "tokenizer.json", json.dump());
  return load_tokenizer(dir.path());
}

std::string load_error(const nlohmann::json& json) {
  const testing::TempDir dir;
  try {
    load_json(dir, json);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(BpeTokenizerFile, MergesByRankInBothForms) {
  // "ab" (256) ranks before "bc" (257), so "abc" is "ab" + "c"; "bcd" is "bc" + "d".
  const std::vector<std::pair<std::string, std::string>> merges{{"a", "b"}, {"b", "c"}, {"ab", "c"}};
  for (const bool arrays : {false, true}) {
    const testing::TempDir dir;
    const auto tokenizer = load_json(dir, tiny_tokenizer(merges, arrays));
    EXPECT_EQ(tokenizer->encode("abc"), Ids{258}) << arrays;
    EXPECT_EQ(tokenizer->encode("bcd"), (Ids{257, 'd'})) << arrays;
    EXPECT_EQ(tokenizer->encode("abab"), (Ids{256, 256})) << arrays;
    EXPECT_EQ(tokenizer->vocab_size(), 259);
  }
}

TEST(BpeTokenizerFile, Gpt2ByteLevelSplitAndPrefixSpace) {
  auto json = tiny_tokenizer({{" ", "a"}}, false);
  const testing::TempDir dir;
  // GPT-2's regex keeps a space with the word after it: "a a" -> "a", " a".
  EXPECT_EQ(load_json(dir, json)->encode("a a"), (Ids{'a', 256}));
  json["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(load_json(dir, json)->encode("a a"), (Ids{256, 256}));
}

TEST(BpeTokenizerFile, Llama3SplitGroupsDigitsByThree) {
  auto json = tiny_tokenizer({{"1", "2"}, {"12", "3"}, {"4", "5"}}, false);
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  json["model"]["ignore_merges"] = true;
  const testing::TempDir dir;
  // "12345" splits into "123" (257) and "45" (258).
  EXPECT_EQ(load_json(dir, json)->encode("12345"), (Ids{257, 258}));
}

TEST(BpeTokenizerFile, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // Merges alone make "abc" into "a" + "bc"; with ignore_merges the vocabulary's "abc" wins.
  auto json = tiny_tokenizer({{"b", "c"}}, false);
  json["model"]["vocab"]["abc"] = 300;
  const testing::TempDir dir;
  EXPECT_EQ(load_json(dir, json)->encode("abc"), (Ids{'a', 256}));
  json["model"]["ignore_merges"] = true;
  EXPECT_EQ(load_json(dir, json)->encode("abc"), Ids{300});
}

TEST(BpeTokenizerFile, AddedTokenOptions) {
  auto json = tiny_tokenizer({}, false);
  const auto added = [](int id, const std::string& content) {
    return nlohmann::json{{"id", id},         {"content", content}, {"single_word", false},
                          {"lstrip", false},  {"rstrip", false},    {"normalized", false},
                          {"special", true}};
  };
  json["added_tokens"] = {added(300, "<s>"), added(301, "<sep>"), added(302, "MASK"),
                          added(303, "<s>x")};
  json["added_tokens"][1]["lstrip"] = true;
  json["added_tokens"][1]["rstrip"] = true;
  json["added_tokens"][2]["single_word"] = true;
  const testing::TempDir dir;
  const auto tokenizer = load_json(dir, json);
  EXPECT_EQ(tokenizer->vocab_size(), 304);
  // Longest match first: "<s>x" beats "<s>".
  EXPECT_EQ(tokenizer->encode("<s>x<s>"), (Ids{303, 300}));
  // lstrip and rstrip swallow the white space around "<sep>".
  EXPECT_EQ(tokenizer->encode("a  <sep> \tb"), (Ids{'a', 301, 'b'}));
  // single_word: "MASK" only where no word character touches it.
  EXPECT_EQ(tokenizer->encode("MASK."), (Ids{302, '.'}));
  EXPECT_EQ(tokenizer->encode("MASKS").size(), 5u);
  EXPECT_EQ(tokenizer->decode(Ids{300, 'a', 301}), "<s>a<sep>");
}

TEST(BpeTokenizerFile, NormalizedAddedTokensMatchTheNfcText) {
  auto json = tiny_tokenizer({}, false);
  json["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  json["added_tokens"] = {{{"id", 300}, {"content", "Cafe\u0301"}, {"normalized", true},
                           {"special", false}}};
  const testing::TempDir dir;
  const auto tokenizer = load_json(dir, json);
  EXPECT_EQ(tokenizer->encode("Caf\u00e9!"), (Ids{300, '!'}));
  EXPECT_EQ(tokenizer->encode("Cafe\u0301!"), (Ids{300, '!'}));
}

TEST(BpeTokenizerFile, RefusesWhatItCannotHonour) {
  const auto base = tiny_tokenizer({}, false);
  const auto expect_error = [](nlohmann::json json, const std::string& part) {
    const std::string message = load_error(json);
    EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
  };
  auto json = base;
  json["normalizer"] = {{"type", "NFKC"}};
  expect_error(json, "normalizer: type 'NFKC' is not supported");
  json = base;
  json["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(json, "pre_tokenizer");
  json = base;
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Removed"}},
                             {{"type", "ByteLevel"}}}}};
  expect_error(json, "behavior 'Removed'");
  json["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(json, "invalid regular expression '(unclosed'");
  json = base;
  json["model"]["type"] = "WordPiece";
  expect_error(json, "model: type 'WordPiece'");
  json = base;
  json["model"]["byte_fallback"] = true;
  expect_error(json, "byte_fallback");
  json = base;
  json["decoder"] = {{"type", "Metaspace"}};
  expect_error(json, "decoder: type 'Metaspace'");
  json = base;
  json["model"]["merges"] = {"a b c"};
  expect_error(json, "merge \"a b c\"");
  json = base;
  json["model"]["merges"] = {"a x"};
  json["model"]["vocab"].erase("x");
  expect_error(json, "lacks the byte-level token 'x'");
  json = base;
  json["model"]["merges"] = {"a b"};
  expect_error(json, "'ab', which is not in the vocabulary");
  EXPECT_THROW(load_tokenizer("/nonexistent/folder"), std::runtime_error);
}

// ---- Character tokenizer ----

TEST(CharTokenizer, EncodesCharactersAndSpecialTokens) {
  const CharTokenizer tokenizer("0123456789+=");
  EXPECT_EQ(tokenizer.vocab_size(), 15);
  EXPECT_EQ(tokenizer.special_ids().pad, 0);
  EXPECT_EQ(tokenizer.special_ids().bos, 1);
  EXPECT_EQ(tokenizer.special_ids().eos, 2);
  EXPECT_EQ(tokenizer.encode("<bos>12+3=15<eos>"), (Ids{1, 4, 5, 13, 6, 14, 4, 8, 2}));
  EXPECT_EQ(tokenizer.decode(Ids{1, 4, 5, 13, 6, 14, 4, 8, 2}), "<bos>12+3=15<eos>");
  EXPECT_EQ(tokenizer.id_of("+"), 13);
  EXPECT_THROW(tokenizer.decode(Ids{15}), std::out_of_range);
}

TEST(CharTokenizer, NamesAnUnknownCharacterAndItsPosition) {
  const CharTokenizer tokenizer("ab", {"<eos>"});
  EXPECT_EQ(tokenizer.special_ids().eos, 0);
  EXPECT_FALSE(tokenizer.special_ids().pad);
  try {
    tokenizer.encode("ab\u00e9");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'\u00e9' (U+00E9) at byte offset 2"), std::string::npos)
        << e.what();
  }
}

TEST(CharTokenizer, TakesAnyUnicodeAlphabetAndRefusesRepeats) {
  const CharTokenizer tokenizer("αβγ→", {});
  EXPECT_EQ(tokenizer.encode("γ→α"), (Ids{2, 3, 0}));
  EXPECT_THROW(CharTokenizer("abca"), std::invalid_argument);
  EXPECT_THROW(CharTokenizer("ab", {"<x>", "<x>"}), std::invalid_argument);
}

// ---- tandem tokenize ----

int run_tokenize(std::vector<std::string> args, const std::string& input, std::string& output,
                 std::string& errors) {
  args.insert(args.begin(), "tokenize");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  std::istringstream in(input);
  std::ostringstream out, err;
  const int status = tokenize_command(static_cast<int>(argv.size()), argv.data(), in, out, err);
  output = out.str();
  errors = err.str();
  return status;
}

TEST_F(Qwen3Tokenizer, TokenizeCommandEncodesAndDecodesLines) {
  std::string output, errors;
  const std::string folder = qwen3_folder().string();
  ASSERT_EQ(run_tokenize({"--tokenizer", folder}, "Hello world\n\n<|im_start|>user\n", output, errors), 0)
      << errors;
  EXPECT_EQ(output, "9707 1879\n\n151644 872\n");
  const std::string ids = output;
  ASSERT_EQ(run_tokenize({"--tokenizer", folder + "/tokenizer.json", "--decode"}, ids, output, errors), 0)
      << errors;
  EXPECT_EQ(output, "Hello world\n\n<|im_start|>user\n");
}

TEST_F(Qwen3Tokenizer, TokenizeCommandReportsErrors) {
  std::string output, errors;
  const std::string folder = qwen3_folder().string();
  EXPECT_EQ(run_tokenize({}, "", output, errors), 2);
  EXPECT_NE(errors.find("--tokenizer"), std::string::npos) << errors;
  EXPECT_EQ(run_tokenize({"--tokenizer", folder, "--decode"}, "9707\n12 x\n", output, errors), 1);
  EXPECT_EQ(output, "Hello\n");
  EXPECT_NE(errors.find("line 2: 'x' is not a token id"), std::string::npos) << errors;
  EXPECT_EQ(run_tokenize({"--tokenizer", folder, "--decode"}, "999999\n", output, errors), 1);
  EXPECT_NE(errors.find("999999"), std::string::npos) << errors;
}

}  // namespace
}  // namespace tandem
