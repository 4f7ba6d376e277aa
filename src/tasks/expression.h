// A safe evaluator for the arithmetic a model writes in a Countdown answer: non-negative
// integer literals, + - * / (also ×, ÷ and the minus sign −), parentheses and spaces,
// evaluated exactly over the rationals, so "7/2*2" is 7 and no rounding can make a wrong
// answer right. Nothing else is accepted: no unary minus, no exponent, no decimals, no names.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// A fraction in lowest terms with a positive denominator.
struct Rational {
  int64_t numerator = 0;
  int64_t denominator = 1;
  friend bool operator==(const Rational&, const Rational&) = default;
};

struct ExpressionValue {
  // Why the text is not an expression (with the byte offset), or empty when it is one.
  std::string syntax_error;
  // The integer literals in order of appearance (filled when the syntax is valid).
  std::vector<int64_t> numbers;
  // The exact value; nullopt for a division by zero or a result beyond 64-bit fractions.
  std::optional<Rational> value;
  std::string arithmetic_error;  // why value is missing
};

// Never throws for bad input: a malformed completion is an answer to score, not a fault.
ExpressionValue evaluate_expression(std::string_view text);

}  // namespace tandem
