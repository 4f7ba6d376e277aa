// Plain-text tables for the log: the start-up setup box (llm.c style) and the
// end-of-run phase breakdown (LAMMPS style).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace tandem {

// A boxed two-column table: title row, then "key | value" rows; a row whose key is
// empty and value is empty draws a separator.
std::string format_box(const std::string& title, const std::vector<std::pair<std::string, std::string>>& rows);

// Columns left-aligned for the first, right-aligned for the others.
std::string format_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

std::string format_bytes(double bytes);     // "1.50 GiB"
std::string format_fixed(double value, int decimals);

}  // namespace tandem
