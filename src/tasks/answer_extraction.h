// Finding the answer inside what a model wrote: the last number, the last \boxed{...}, the
// last <answer>...</answer>. Each takes the LAST occurrence, as the math graders of the
// reference systems do, since a model restates the question's numbers before its answer.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// The text without leading and trailing ASCII whitespace.
std::string_view trim_ascii(std::string_view text);

// The last decimal number ("-12", "3.5", "1,234,567" with its commas dropped), or nullopt.
std::optional<std::string> last_number(std::string_view text);

// Both texts read as decimal numbers (no other characters) and are equal in value
// ("72" and "72.0" are; "1e3" is not a number here).
bool same_number(std::string_view a, std::string_view b);

// The content of the last \boxed{...}, braces inside it balanced, or nullopt when there is
// none or it is not closed.
std::optional<std::string_view> last_boxed(std::string_view text);

// The content of the last `open` ... `close` pair, or nullopt.
std::optional<std::string_view> last_tagged(std::string_view text, std::string_view open, std::string_view close);

}  // namespace tandem
