// The JSONL prompt-file task: reading, line-numbered errors, epoch order, reward modes.
#include <gtest/gtest.h>

#include <set>

#include "support.h"
#include "tasks/jsonl_task.h"

namespace tandem {
namespace {

using testing::TempDir;
using testing::write_text;

JsonlTask task_from(const TempDir& dir, const std::string& text, AnswerMatch match = AnswerMatch::Exact,
                    uint64_t seed = 0) {
  write_text(dir / "prompts.jsonl", text);
  return JsonlTask({.path = dir / "prompts.jsonl", .match = match, .seed = seed});
}

// The message of the error that reading `text` raises.
std::string load_error(const std::string& text, AnswerMatch match = AnswerMatch::Exact) {
  TempDir dir;
  try {
    task_from(dir, text, match);
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    const std::string prefix = (dir / "prompts.jsonl").string() + ":";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
    return message.substr(prefix.size());
  }
  ADD_FAILURE() << "expected an error for: " << text;
  return "";
}

TEST(JsonlTask, ReadsPromptsAndSkipsBlankLinesWithAnyLineEnd) {
  TempDir dir;
  const JsonlTask task = task_from(dir,
                                   "{\"prompt\": \"What is 2+2?\", \"answer\": \"4\"}\n"
                                   "\n"
                                   "  \n"
                                   "{\"answer\": 72, \"prompt\": \"How many?\", \"id\": 3}\r\n"
                                   "{\"prompt\": \"caf\\u00e9?\", \"answer\": 0.5}");  // no final newline
  ASSERT_EQ(task.size(), 3u);
  std::set<std::pair<std::string, std::string>> seen;
  for (uint64_t i = 0; i < 3; ++i) seen.insert({task.sample(i).text, task.sample(i).answer});
  EXPECT_EQ(seen, (std::set<std::pair<std::string, std::string>>{
                      {"What is 2+2?", "4"}, {"How many?", "72"}, {"caf\u00e9?", "0.5"}}));
}

TEST(JsonlTask, EachEpochVisitsEveryLineOnceInASeededOrder) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 10; ++i) text += "{\"prompt\": \"p" + std::to_string(i) + "\", \"answer\": \"a\"}\n";
  const JsonlTask task = task_from(dir, text, AnswerMatch::Exact, 3);
  const JsonlTask same = task_from(dir, text, AnswerMatch::Exact, 3);
  const JsonlTask other = task_from(dir, text, AnswerMatch::Exact, 4);
  std::vector<std::string> epoch0, epoch1, other0;
  for (uint64_t i = 0; i < 10; ++i) {
    epoch0.push_back(task.sample(i).text);
    epoch1.push_back(task.sample(10 + i).text);
    other0.push_back(other.sample(i).text);
    EXPECT_EQ(task.sample(i).text, same.sample(i).text);
    EXPECT_EQ(task.sample(i).index, i);
  }
  EXPECT_EQ(std::set<std::string>(epoch0.begin(), epoch0.end()).size(), 10u);
  EXPECT_EQ(std::set<std::string>(epoch1.begin(), epoch1.end()).size(), 10u);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch0, other0);
}

TEST(JsonlTask, NamesTheLineOfEveryBadRecord) {
  const std::string good = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
  EXPECT_EQ(load_error(good + good + "{\"prompt\": \"p\", \"answer\": }\n").substr(0, 18), "3: not valid JSON ");
  EXPECT_EQ(load_error(good + "\n\n" + "{\"prompt\": \"p\"}\n"), "4: missing key \"answer\"");
  EXPECT_EQ(load_error("{\"answer\": \"a\"}\n"), "1: missing key \"prompt\"");
  EXPECT_EQ(load_error(good + "{\"prompt\": 5, \"answer\": \"a\"}"), "2: \"prompt\" must be a string, got a number");
  EXPECT_EQ(load_error("{\"prompt\": \"p\", \"answer\": [1]}"),
            "1: \"answer\" must be a string or a number, got an array");
  EXPECT_EQ(load_error("[\"p\", \"a\"]"), "1: expected a JSON object {\"prompt\": ..., \"answer\": ...}, got an array");
  EXPECT_EQ(load_error(good + "{\"prompt\": \"p\", \"answer\": \"a\"} trailing").substr(0, 18), "2: not valid JSON ");
  EXPECT_EQ(load_error("{\"prompt\": \"p\", \"answer\": \"none\"}", AnswerMatch::LastNumber),
            "1: the answer 'none' has no number for last-number matching");
  EXPECT_EQ(load_error("\n \n"), " no prompts (the file has no non-blank lines)");
  EXPECT_THROW(JsonlTask({.path = "/nonexistent/prompts.jsonl"}), std::runtime_error);
}

TEST(JsonlTask, ExactMatch) {
  TempDir dir;
  const JsonlTask task = task_from(dir, "{\"prompt\": \"Capital of France?\", \"answer\": \" Paris \"}");
  const Prompt p = task.sample(0);
  EXPECT_DOUBLE_EQ(task.reward(p, "Paris\n"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(p, "paris"), 0.1);
  EXPECT_DOUBLE_EQ(task.reward(p, "  "), 0.0);
  EXPECT_EQ(task.judge(p, "").note, "empty completion");
}

TEST(JsonlTask, LastNumberMatch) {
  TempDir dir;
  const JsonlTask task =
      task_from(dir, "{\"prompt\": \"Eggs?\", \"answer\": \"She sells 16-3-4=9 eggs.\\n#### 1,018\"}",
                AnswerMatch::LastNumber);
  const Prompt p = task.sample(0);
  EXPECT_DOUBLE_EQ(task.reward(p, "16 - 3 = 13, so the total is 1018.0 dollars"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(p, "The answer is 1,018"), 1.0);
  const RewardBreakdown wrong = task.judge(p, "1018 or maybe 1019");
  EXPECT_EQ(wrong.format, 1);
  EXPECT_EQ(wrong.correct, 0);
  EXPECT_EQ(wrong.note, "1019 is not 1018");
  EXPECT_EQ(task.judge(p, "no idea").format, 0);
}

TEST(JsonlTask, BoxedMatch) {
  TempDir dir;
  const JsonlTask task = task_from(dir,
                                   "{\"prompt\": \"Half?\", \"answer\": \"\\\\frac{1}{2}\"}\n"
                                   "{\"prompt\": \"Sum?\", \"answer\": \"The sum is \\\\boxed{72}.\"}\n",
                                   AnswerMatch::Boxed);
  const Prompt half{0, "Half?", "\\frac{1}{2}"};
  const Prompt sum{1, "Sum?", "The sum is \\boxed{72}."};
  EXPECT_DOUBLE_EQ(task.reward(half, "so \\boxed{ \\frac{1}{2} }"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(half, "\\boxed{\\frac{1}{3}}"), 0.1);
  EXPECT_DOUBLE_EQ(task.reward(half, "\\frac{1}{2}"), 0.0);
  EXPECT_EQ(task.judge(half, "1/2").note, "no \\boxed{...}");
  // The reference's own \boxed{} is what counts, and numbers match by value.
  EXPECT_DOUBLE_EQ(task.reward(sum, "\\boxed{72.0}"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(sum, "\\boxed{7} then \\boxed{72}"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(sum, "\\boxed{72} then \\boxed{7}"), 0.1);
}

TEST(JsonlTask, AnswerMatchNames) {
  EXPECT_EQ(answer_match_from_name("exact"), AnswerMatch::Exact);
  EXPECT_EQ(answer_match_from_name("last-number"), AnswerMatch::LastNumber);
  EXPECT_EQ(answer_match_from_name("boxed"), AnswerMatch::Boxed);
  EXPECT_THROW(answer_match_from_name("Boxed"), std::invalid_argument);
}

TEST(JsonlTask, ReferenceCompletionEarnsTheFullReward) {
  TempDir dir;
  const std::string lines = "{\"prompt\": \"6*12?\", \"answer\": 72}\n{\"prompt\": \"x\", \"answer\": \"so \\\\boxed{9}\"}\n";
  for (const AnswerMatch match : {AnswerMatch::Exact, AnswerMatch::LastNumber, AnswerMatch::Boxed}) {
    const JsonlTask task = task_from(dir, lines, match);
    for (uint64_t i = 0; i < task.size(); ++i) {
      const Prompt prompt = task.sample(i);
      EXPECT_DOUBLE_EQ(task.reward(prompt, task.reference_completion(prompt)), 1.0) << task.reference_completion(prompt);
    }
  }
  const JsonlTask boxed = task_from(dir, lines, AnswerMatch::Boxed);
  for (uint64_t i = 0; i < 2; ++i) {
    const Prompt prompt = boxed.sample(i);
    EXPECT_EQ(boxed.reference_completion(prompt), prompt.text == "x" ? "\\boxed{9}" : "\\boxed{72}");
  }
}

}  // namespace
}  // namespace tandem
