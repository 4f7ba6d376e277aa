#include "world/table.h"

#include <algorithm>
#include <cstdio>

namespace tandem {

std::string format_fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return format_fixed(bytes, unit == 0 ? 0 : 2) + " " + units[unit];
}

std::string format_box(const std::string& title, const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t key_width = 0, value_width = 0;
  for (const auto& [key, value] : rows) {
    key_width = std::max(key_width, key.size());
    value_width = std::max(value_width, value.size());
  }
  value_width = std::max(value_width, title.size() > key_width + 3 ? title.size() - key_width - 3 : 0);
  const std::string rule = "+" + std::string(key_width + 2, '-') + "+" + std::string(value_width + 2, '-') + "+\n";
  const std::string wide_rule = "+" + std::string(key_width + value_width + 5, '-') + "+\n";
  std::string text = wide_rule + "| " + title + std::string(key_width + value_width + 3 - title.size(), ' ') + " |\n" + rule;
  for (const auto& [key, value] : rows) {
    if (key.empty() && value.empty()) {
      text += rule;
      continue;
    }
    text += "| " + key + std::string(key_width - key.size(), ' ') + " | " + value +
            std::string(value_width - value.size(), ' ') + " |\n";
  }
  return text + rule;
}

std::string format_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < widths.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      const std::string pad(widths[c] - cell.size(), ' ');
      text += (c ? " | " : "") + (c == 0 ? cell + pad : pad + cell);
    }
    return text + "\n";
  };
  std::string rule;
  for (size_t c = 0; c < widths.size(); ++c) rule += (c ? "-+-" : "") + std::string(widths[c], '-');
  std::string text = line(header) + rule + "\n";
  for (const auto& row : rows) text += line(row);
  return text;
}

}  // namespace tandem
