#include "tasks/expression.h"

#include <utility>

namespace tandem {
namespace {

constexpr int kMaxDepth = 64;            // parentheses nesting; deeper is refused, not recursed into
constexpr size_t kMaxLiteralDigits = 12;  // keeps every literal far inside int64

std::optional<Rational> reduced(__int128 numerator, __int128 denominator) {
  if (denominator < 0) numerator = -numerator, denominator = -denominator;
  __int128 a = numerator < 0 ? -numerator : numerator, b = denominator;
  while (b != 0) a %= b, std::swap(a, b);
  if (a > 1) numerator /= a, denominator /= a;
  constexpr __int128 kMax = INT64_MAX;
  if (numerator > kMax || numerator < -kMax || denominator > kMax) return std::nullopt;
  return Rational{static_cast<int64_t>(numerator), static_cast<int64_t>(denominator)};
}

// Recursive descent; arithmetic errors are recorded and parsing goes on, so a division by
// zero still counts as well-formed and the syntax of the whole text is always checked.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  ExpressionValue run() {
    ExpressionValue result;
    const std::optional<Rational> value = sum(0);
    skip_spaces();
    if (error_.empty() && pos_ != text_.size()) fail("unexpected '" + std::string(1, text_[pos_]) + "'");
    if (!error_.empty()) {
      result.syntax_error = error_;
      return result;
    }
    result.numbers = std::move(numbers_);
    result.value = value;
    result.arithmetic_error = arithmetic_error_;
    return result;
  }

 private:
  void fail(const std::string& reason) {
    if (error_.empty()) error_ = reason + " at byte " + std::to_string(pos_);
  }
  void skip_spaces() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  // Consumes one of the operator spellings and returns its ASCII form, or 0.
  char take_operator(std::string_view ascii_ops) {
    skip_spaces();
    static constexpr std::pair<std::string_view, char> kSpellings[] = {
        {"+", '+'}, {"-", '-'}, {"*", '*'}, {"/", '/'}, {"\u00d7", '*'}, {"\u00f7", '/'}, {"\u2212", '-'}};
    for (const auto& [spelling, op] : kSpellings) {
      if (ascii_ops.find(op) != std::string_view::npos && text_.substr(pos_).starts_with(spelling)) {
        pos_ += spelling.size();
        return op;
      }
    }
    return 0;
  }

  std::optional<Rational> combine(char op, const std::optional<Rational>& left, const std::optional<Rational>& right) {
    if (!left || !right) return std::nullopt;
    const __int128 a = left->numerator, b = left->denominator, c = right->numerator, d = right->denominator;
    std::optional<Rational> result;
    switch (op) {
      case '+': result = reduced(a * d + c * b, b * d); break;
      case '-': result = reduced(a * d - c * b, b * d); break;
      case '*': result = reduced(a * c, b * d); break;
      default:
        if (c == 0) {
          if (arithmetic_error_.empty()) arithmetic_error_ = "division by zero";
          return std::nullopt;
        }
        result = reduced(a * d, b * c);
    }
    if (!result && arithmetic_error_.empty()) arithmetic_error_ = "a value beyond 64-bit fractions";
    return result;
  }

  std::optional<Rational> sum(int depth) {
    std::optional<Rational> value = product(depth);
    while (error_.empty()) {
      const char op = take_operator("+-");
      if (!op) break;
      value = combine(op, value, product(depth));
    }
    return value;
  }

  std::optional<Rational> product(int depth) {
    std::optional<Rational> value = factor(depth);
    while (error_.empty()) {
      const char op = take_operator("*/");
      if (!op) break;
      value = combine(op, value, factor(depth));
    }
    return value;
  }

  std::optional<Rational> factor(int depth) {
    skip_spaces();
    if (pos_ >= text_.size()) {
      fail("expression ends early");
      return std::nullopt;
    }
    if (text_[pos_] == '(') {
      if (depth >= kMaxDepth) {
        fail("parentheses nested deeper than " + std::to_string(kMaxDepth));
        return std::nullopt;
      }
      ++pos_;
      std::optional<Rational> value = sum(depth + 1);
      skip_spaces();
      if (!error_.empty()) return std::nullopt;
      if (pos_ >= text_.size() || text_[pos_] != ')') {
        fail("missing ')'");
        return std::nullopt;
      }
      ++pos_;
      return value;
    }
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == start) {
      fail("expected a number or '('");
      return std::nullopt;
    }
    if (pos_ - start > kMaxLiteralDigits) {
      pos_ = start;
      fail("a number longer than " + std::to_string(kMaxLiteralDigits) + " digits");
      return std::nullopt;
    }
    int64_t literal = 0;
    for (size_t i = start; i < pos_; ++i) literal = literal * 10 + (text_[i] - '0');
    numbers_.push_back(literal);
    return Rational{literal, 1};
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
  std::string arithmetic_error_;
  std::vector<int64_t> numbers_;
};

}  // namespace

ExpressionValue evaluate_expression(std::string_view text) { return Parser(text).run(); }

}  // namespace tandem
