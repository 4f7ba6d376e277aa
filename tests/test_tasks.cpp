// The verifiable tasks: prompts deterministic from (seed, index), rewards on hand-written
// completions, the expression evaluator, answer extraction and the seeded shuffle.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>

#include "tasks/answer_extraction.h"
#include "tasks/arithmetic_task.h"
#include "tasks/char_tokenizer.h"
#include "tasks/countdown_task.h"
#include "tasks/expression.h"
#include "tasks/prompt_random.h"
#include "tasks/shuffled_index.h"

namespace tandem {
namespace {

// ---- Seeded randomness ----

TEST(PromptRandom, SameSeedAndIndexSameStreamOtherwiseNot) {
  PromptRandom a(7, 3), b(7, 3), other_index(7, 4), other_seed(8, 3);
  const uint64_t first = a.next();
  EXPECT_EQ(first, b.next());
  EXPECT_NE(first, other_index.next());
  EXPECT_NE(first, other_seed.next());
  // Pinned: a change here changes every task's prompts on every machine. With seed and
  // index 0 the stream is SplitMix64 started from 0, whose first output is well known.
  EXPECT_EQ(PromptRandom(0, 0).next(), 0xe220a8397b1dcdafull);
}

TEST(PromptRandom, UniformStaysInRangeAndReachesBothEnds) {
  PromptRandom random(1, 1);
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = random.uniform(-3, 4);
    ASSERT_GE(v, -3);
    ASSERT_LE(v, 4);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(random.uniform(5, 5), 5);
  EXPECT_THROW(random.uniform(2, 1), std::invalid_argument);
}

TEST(ShuffledIndex, IsAPermutationForEverySize) {
  for (const uint64_t n : {1ull, 2ull, 3ull, 10ull, 1000ull, 4097ull}) {
    std::vector<bool> hit(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t j = shuffled_index(i, n, 99);
      ASSERT_LT(j, n);
      ASSERT_FALSE(hit[j]) << "n=" << n << " i=" << i;
      hit[j] = true;
    }
  }
  // Different keys give different orders.
  int same = 0;
  for (uint64_t i = 0; i < 100; ++i) same += shuffled_index(i, 100, 1) == shuffled_index(i, 100, 2);
  EXPECT_LT(same, 20);
  EXPECT_THROW(shuffled_index(5, 5, 0), std::out_of_range);
}

// ---- Expression evaluator ----

Rational value_of(std::string_view text) {
  const ExpressionValue v = evaluate_expression(text);
  EXPECT_EQ(v.syntax_error, "") << text;
  EXPECT_TRUE(v.value) << text << ": " << v.arithmetic_error;
  return v.value.value_or(Rational{-999, 1});
}

TEST(Expression, EvaluatesWithPrecedenceAndLeftAssociativity) {
  EXPECT_EQ(value_of("3*7+5"), (Rational{26, 1}));
  EXPECT_EQ(value_of("5+3*7"), (Rational{26, 1}));
  EXPECT_EQ(value_of("(5+3)*7"), (Rational{56, 1}));
  EXPECT_EQ(value_of("8-4-2"), (Rational{2, 1}));
  EXPECT_EQ(value_of("8/4/2"), (Rational{1, 1}));
  EXPECT_EQ(value_of(" ( 1 + 2 ) * 3 "), (Rational{9, 1}));
  EXPECT_EQ(value_of("3 \u00d7 7 \u2212 5 \u00f7 5"), (Rational{20, 1}));
  EXPECT_EQ(value_of("2-7"), (Rational{-5, 1}));
}

TEST(Expression, DivisionIsExactOverTheRationals) {
  EXPECT_EQ(value_of("7/2"), (Rational{7, 2}));
  EXPECT_EQ(value_of("7/2*2"), (Rational{7, 1}));
  EXPECT_EQ(value_of("1/3+1/6"), (Rational{1, 2}));
  EXPECT_EQ(value_of("4/6"), (Rational{2, 3}));
}

TEST(Expression, ListsTheNumbersItUses) {
  EXPECT_EQ(evaluate_expression("(3+5)*5-12").numbers, (std::vector<int64_t>{3, 5, 5, 12}));
}

TEST(Expression, DivisionByZeroAndOverflowAreArithmeticErrorsNotSyntaxErrors) {
  const ExpressionValue zero = evaluate_expression("2/(4-4)+8");
  EXPECT_EQ(zero.syntax_error, "");
  EXPECT_FALSE(zero.value);
  EXPECT_EQ(zero.arithmetic_error, "division by zero");
  const ExpressionValue big = evaluate_expression("999999999999*999999999999*999999999999");
  EXPECT_EQ(big.syntax_error, "");
  EXPECT_FALSE(big.value);
  EXPECT_EQ(big.arithmetic_error, "a value beyond 64-bit fractions");
}

TEST(Expression, RejectsWhatIsNotAnExpressionWithThePosition) {
  const auto error = [](std::string_view text) { return evaluate_expression(text).syntax_error; };
  EXPECT_EQ(error(""), "expression ends early at byte 0");
  EXPECT_EQ(error("3*+7"), "expected a number or '(' at byte 2");
  EXPECT_EQ(error("-3+7"), "expected a number or '(' at byte 0");  // no unary minus
  EXPECT_EQ(error("3 7"), "unexpected '7' at byte 2");
  EXPECT_EQ(error("2^3"), "unexpected '^' at byte 1");
  EXPECT_EQ(error("1.5*2"), "unexpected '.' at byte 1");
  EXPECT_EQ(error("((3+4)"), "missing ')' at byte 6");
  EXPECT_EQ(error("3)"), "unexpected ')' at byte 1");
  EXPECT_EQ(error("1234567890123+1"), "a number longer than 12 digits at byte 0");
  // Deep nesting is refused, not recursed into without bound.
  const std::string deep = std::string(100, '(') + "3" + std::string(100, ')');
  EXPECT_EQ(error(deep), "parentheses nested deeper than 64 at byte 64");
  EXPECT_TRUE(evaluate_expression("3*+7").numbers.empty());
}

// ---- Answer extraction ----

TEST(AnswerExtraction, LastNumber) {
  EXPECT_EQ(last_number("The answer is 1,234."), "1234");
  EXPECT_EQ(last_number("first 12, then 3.50 dollars"), "3.50");
  EXPECT_EQ(last_number("x = -3"), "-3");
  EXPECT_EQ(last_number("10-3"), "3");  // a subtraction, not a sign
  EXPECT_EQ(last_number("3,5,7"), "7");  // a list, not thousands
  EXPECT_EQ(last_number("#### 72"), "72");
  EXPECT_EQ(last_number("no digits here"), std::nullopt);
}

TEST(AnswerExtraction, SameNumber) {
  EXPECT_TRUE(same_number("72", "72.0"));
  EXPECT_TRUE(same_number("-0.5", "-.5"));
  EXPECT_FALSE(same_number("72", "73"));
  EXPECT_FALSE(same_number("1e3", "1000"));
  EXPECT_FALSE(same_number("inf", "inf"));
  EXPECT_FALSE(same_number("", ""));
  EXPECT_FALSE(same_number("5.", "5"));
}

TEST(AnswerExtraction, BoxedAndTagged) {
  EXPECT_EQ(last_boxed("so \\boxed{3} or rather \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(last_boxed("\\boxed{5"), std::nullopt);
  EXPECT_EQ(last_boxed("5"), std::nullopt);
  EXPECT_EQ(last_tagged("<answer>1</answer> <answer> 2 </answer>", "<answer>", "</answer>"), " 2 ");
  EXPECT_EQ(last_tagged("<answer>1", "<answer>", "</answer>"), std::nullopt);
  EXPECT_EQ(last_tagged("1</answer>", "<answer>", "</answer>"), std::nullopt);
  EXPECT_EQ(trim_ascii(" \t 4 2\n"), "4 2");
}

// ---- Arithmetic ----

TEST(ArithmeticTask, PromptsAreDeterministicFromSeedAndIndex) {
  const ArithmeticTask task({.seed = 5});
  const ArithmeticTask same({.seed = 5});
  const ArithmeticTask other({.seed = 6});
  int differ = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    const Prompt p = task.sample(i);
    EXPECT_EQ(p.index, i);
    EXPECT_EQ(p.text, same.sample(i).text);
    EXPECT_EQ(p.answer, same.sample(i).answer);
    differ += p.text != other.sample(i).text;
  }
  EXPECT_GT(differ, 40);
  EXPECT_EQ(task.sample(3).text, task.sample(3).text);
}

TEST(ArithmeticTask, CompactPromptsAreShortAndTheirAnswersRight) {
  const ArithmeticTask task({.seed = 1, .digits = 2, .operations = "+-*"});
  const std::regex form(R"((\d{1,2})([-+*])(\d{1,2})=)");
  std::set<char> operations;
  for (uint64_t i = 0; i < 300; ++i) {
    const Prompt p = task.sample(i);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(p.text, m, form)) << p.text;
    const int64_t a = std::stoll(m[1]), b = std::stoll(m[3]);
    const char op = m[2].str()[0];
    operations.insert(op);
    EXPECT_EQ(p.answer, std::to_string(op == '+' ? a + b : op == '-' ? a - b : a * b)) << p.text;
  }
  EXPECT_EQ(operations.size(), 3u);
}

TEST(ArithmeticTask, EveryPromptAndAnswerFitsTheCharacterTokenizer) {
  const ArithmeticTask task({.seed = 2, .digits = 3, .operations = "+-"});
  const CharTokenizer tokenizer(task.alphabet());
  EXPECT_LT(tokenizer.vocab_size(), 20);
  for (uint64_t i = 0; i < 200; ++i) {
    const Prompt p = task.sample(i);
    // The training text: prompt, answer, then <eos>.
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(p.text + p.answer + "<eos>")), p.text + p.answer + "<eos>");
  }
}

TEST(ArithmeticTask, RewardsTheExactAnswer) {
  const ArithmeticTask task({.seed = 0});
  const Prompt p{0, "12+34=", "46"};
  const RewardBreakdown right = task.judge(p, "46");
  EXPECT_EQ(right.format, 1);
  EXPECT_EQ(right.correct, 1);
  EXPECT_DOUBLE_EQ(right.total, 1.0);
  EXPECT_EQ(right.note, "");
  EXPECT_DOUBLE_EQ(task.reward(p, " 46\n"), 1.0);
  const RewardBreakdown wrong = task.judge(p, "45");
  EXPECT_EQ(wrong.format, 1);
  EXPECT_EQ(wrong.correct, 0);
  EXPECT_DOUBLE_EQ(wrong.total, 0.1);
  EXPECT_EQ(wrong.note, "45 is not 46");
  EXPECT_DOUBLE_EQ(task.reward(p, "046"), 0.1);  // an integer, but not the answer as written
  for (const char* malformed : {"", "4a6", "46=", "4 6", "+46", "-"}) {
    const RewardBreakdown r = task.judge(p, malformed);
    EXPECT_EQ(r.format, 0) << malformed;
    EXPECT_EQ(r.total, 0) << malformed;
    EXPECT_EQ(r.note, "not an integer");
  }
  EXPECT_DOUBLE_EQ(task.reward({1, "12-34=", "-22"}, "-22"), 1.0);
}

TEST(ArithmeticTask, WeightsAreConfigurable) {
  const ArithmeticTask task({.weights = {.format = 0.25, .correct = 2}});
  EXPECT_DOUBLE_EQ(task.reward({0, "1+1=", "2"}, "2"), 2.25);
  EXPECT_DOUBLE_EQ(task.reward({0, "1+1=", "2"}, "3"), 0.25);
}

TEST(ArithmeticTask, InstructStyleAsksForAnAnswerTag) {
  const ArithmeticTask task({.seed = 3, .style = PromptStyle::Instruct});
  const Prompt p = task.sample(0);
  EXPECT_NE(p.text.find("<answer></answer>"), std::string::npos) << p.text;
  EXPECT_EQ(task.alphabet(), "");
  EXPECT_DOUBLE_EQ(task.reward(p, "Let me add. <answer> " + p.answer + " </answer>"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(p, p.answer), 0.0);
  EXPECT_EQ(task.judge(p, p.answer).note, "no <answer>...</answer>");
}

TEST(ArithmeticTask, RefusesBadSettings) {
  EXPECT_THROW(ArithmeticTask({.digits = 0}), std::invalid_argument);
  EXPECT_THROW(ArithmeticTask({.digits = 10}), std::invalid_argument);
  EXPECT_THROW(ArithmeticTask({.operations = ""}), std::invalid_argument);
  EXPECT_THROW(ArithmeticTask({.operations = "+/"}), std::invalid_argument);
}

// ---- Countdown ----

std::multiset<int64_t> numbers_in(const std::string& text) {
  std::multiset<int64_t> numbers;
  const std::regex number(R"(\d+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it)
    numbers.insert(std::stoll(it->str()));
  return numbers;
}

TEST(CountdownTask, PuzzlesAreDeterministicSolvableAndInRange) {
  const CountdownTask task({.seed = 11, .numbers = 4, .max_number = 25, .max_target = 60});
  const CountdownTask same({.seed = 11, .numbers = 4, .max_number = 25, .max_target = 60});
  const std::regex form(R"((\d+),(\d+),(\d+),(\d+);(\d+)=)");
  std::set<std::string> distinct;
  for (uint64_t i = 0; i < 200; ++i) {
    const Prompt p = task.sample(i);
    EXPECT_EQ(p.text, same.sample(i).text);
    EXPECT_EQ(p.answer, same.sample(i).answer);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(p.text, m, form)) << p.text;
    const int64_t target = std::stoll(m[5]);
    EXPECT_GE(target, 1);
    EXPECT_LE(target, 60);
    // The reference answer uses each shown number once and reaches the shown target.
    std::multiset<int64_t> shown;
    for (int k = 1; k <= 4; ++k) shown.insert(std::stoll(m[k]));
    for (const int64_t n : shown) EXPECT_TRUE(n >= 1 && n <= 25) << p.text;
    EXPECT_EQ(numbers_in(p.answer), shown) << p.text << " " << p.answer;
    EXPECT_EQ(evaluate_expression(p.answer).value, (Rational{target, 1})) << p.answer;
    EXPECT_DOUBLE_EQ(task.reward(p, p.answer), 1.0) << p.answer;
    distinct.insert(p.text);
  }
  EXPECT_GT(distinct.size(), 190u);
}

TEST(CountdownTask, CompactTextFitsTheCharacterTokenizer) {
  const CountdownTask task({.seed = 4});
  const CharTokenizer tokenizer(task.alphabet());
  for (uint64_t i = 0; i < 100; ++i) {
    const Prompt p = task.sample(i);
    EXPECT_NO_THROW(tokenizer.encode(p.text + p.answer + "<eos>")) << p.text << p.answer;
  }
}

TEST(CountdownTask, RewardsFormatAndCorrectness) {
  const CountdownTask task({});
  const Prompt p{0, "3,7,5;26=", "3*7+5"};
  const auto judge = [&](std::string_view completion) { return task.judge(p, completion); };
  const auto expect = [&](std::string_view completion, double format, double correct, const std::string& note) {
    const RewardBreakdown r = judge(completion);
    EXPECT_EQ(r.format, format) << completion;
    EXPECT_EQ(r.correct, correct) << completion;
    EXPECT_DOUBLE_EQ(r.total, 0.1 * format + 0.9 * correct) << completion;
    EXPECT_EQ(r.note, note) << completion;
  };
  expect("3*7+5", 1, 1, "");
  expect("5+7*3", 1, 1, "");
  expect(" (7 \u00d7 3) + 5 ", 1, 1, "");
  expect("(5+3)*7", 1, 0, "equals 56, not 26");
  expect("3*7+5+5", 1, 0, "5 is used more often than given");
  expect("3*7+6", 1, 0, "6 is not given");
  expect("7/3+5", 1, 0, "equals 22/3, not 26");
  expect("3*+7", 0, 0, "not an expression: expected a number or '(' at byte 2");
  expect("", 0, 0, "not an expression: expression ends early at byte 0");
  expect("26", 1, 0, "26 is not given");
  // Fewer numbers than given is allowed when they reach the target.
  const Prompt fewer{0, "2,12,5,5;24=", "2*12/5*5"};
  EXPECT_DOUBLE_EQ(task.reward(fewer, "2*12"), 1.0);
}

TEST(CountdownTask, DivisionByZeroAndFractions) {
  const CountdownTask task({});
  const Prompt p{0, "8,4,4,2;18=", "(8-4)*4+2"};
  const RewardBreakdown zero = task.judge(p, "2/(4-4)+8");
  EXPECT_EQ(zero.format, 1);
  EXPECT_EQ(zero.correct, 0);
  EXPECT_EQ(zero.note, "division by zero");
  // Intermediate fractions are fine when the result is exact: 7/2*2 = 7.
  const Prompt seven{0, "7,2,2;7=", "7*2/2"};
  EXPECT_DOUBLE_EQ(task.reward(seven, "7/2*2"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(seven, "7/2"), 0.1);
  EXPECT_THROW(task.judge({0, "", "3/0"}, "3"), std::invalid_argument);
  EXPECT_THROW(task.judge({0, "", "7/2"}, "3"), std::invalid_argument);
}

TEST(CountdownTask, InstructStyleReadsTheLastAnswerTag) {
  const CountdownTask task({.seed = 9, .style = PromptStyle::Instruct});
  const Prompt p = task.sample(0);
  EXPECT_NE(p.text.find("at most once"), std::string::npos) << p.text;
  EXPECT_DOUBLE_EQ(task.reward(p, "<answer>1+1</answer> no wait <answer>" + p.answer + "</answer>"), 1.0);
  EXPECT_DOUBLE_EQ(task.reward(p, p.answer), 0.0);
  EXPECT_EQ(task.alphabet(), "");
}

TEST(CountdownTask, RefusesBadSettings) {
  EXPECT_THROW(CountdownTask({.numbers = 1}), std::invalid_argument);
  EXPECT_THROW(CountdownTask({.numbers = 7}), std::invalid_argument);
  EXPECT_THROW(CountdownTask({.max_number = 0}), std::invalid_argument);
  EXPECT_THROW(CountdownTask({.max_target = 0}), std::invalid_argument);
  // Settings that leave no reachable target fail with a message, not a hang.
  const CountdownTask impossible({.numbers = 2, .max_number = 1000000, .max_target = 1});
  try {
    (void)impossible.sample(0);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("raise max_target"), std::string::npos) << e.what();
  }
}

// The supervised warm-up's target: the reference answer written as the prompt asks.
TEST(TasksReferenceCompletion, EarnsTheFullRewardInEveryStyle) {
  for (const PromptStyle style : {PromptStyle::Compact, PromptStyle::Instruct}) {
    const ArithmeticTask arithmetic({.seed = 4, .digits = 2, .style = style});
    const CountdownTask countdown({.seed = 4, .style = style});
    for (const Task* task : {static_cast<const Task*>(&arithmetic), static_cast<const Task*>(&countdown)}) {
      for (uint64_t i = 0; i < 20; ++i) {
        const Prompt prompt = task->sample(i);
        const std::string completion = task->reference_completion(prompt);
        EXPECT_DOUBLE_EQ(task->reward(prompt, completion), 1.0) << prompt.text << " -> " << completion;
        EXPECT_EQ(completion.find("<answer>") != std::string::npos, style == PromptStyle::Instruct) << completion;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
