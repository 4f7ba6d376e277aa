// A hash map keyed by std::string that can be searched with a std::string_view,
// so lookups of text slices allocate nothing.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tandem {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const {
    return std::hash<std::string_view>{}(text);
  }
};

template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

}  // namespace tandem
