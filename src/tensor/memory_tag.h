// Memory tags name what a buffer holds. The built-in ones cover the colocated RL step;
// more can be registered by name (for instance by a future component) at any time.
#pragma once
#include <string>

namespace tandem {

struct Tag {
  int id = 0;
  bool operator==(const Tag&) const = default;
  bool operator<(const Tag& other) const { return id < other.id; }
};

namespace tags {
inline constexpr Tag weights{0};         // model parameters the engine reads (bf16 working copy)
inline constexpr Tag master_weights{1};  // FP32 master parameters of the trainer
inline constexpr Tag kv_cache{2};
inline constexpr Tag reference{3};       // the frozen policy of the KL term: trainer memory
inline constexpr Tag grads{4};
inline constexpr Tag optimizer{5};
inline constexpr Tag activations{6};
inline constexpr Tag derived{7};         // rebuildable copies (transposed, quantised, ...)
inline constexpr int kBuiltinCount = 8;
}  // namespace tags

// Registers the name if it is new; the same name always gives the same tag.
Tag tag_named(const std::string& name);
const std::string& tag_name(Tag tag);

}  // namespace tandem
