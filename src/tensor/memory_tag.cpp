#include "tensor/memory_tag.h"

#include <mutex>
#include <stdexcept>
#include <vector>

namespace tandem {

namespace {
std::mutex registry_mutex;
std::vector<std::string>& registry() {
  static std::vector<std::string> names = {"weights",     "master_weights", "kv_cache", "reference",
                                           "grads",       "optimizer",      "activations", "derived"};
  return names;
}
}  // namespace

Tag tag_named(const std::string& name) {
  std::lock_guard lock(registry_mutex);
  auto& names = registry();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return Tag{static_cast<int>(i)};
  names.push_back(name);
  return Tag{static_cast<int>(names.size() - 1)};
}

const std::string& tag_name(Tag tag) {
  std::lock_guard lock(registry_mutex);
  const auto& names = registry();
  if (tag.id < 0 || static_cast<size_t>(tag.id) >= names.size())
    throw std::invalid_argument("unknown memory tag id " + std::to_string(tag.id));
  return names[tag.id];
}

}  // namespace tandem
