#include "driver/sampled_group.h"

#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "world/world.h"

namespace tandem {
namespace {

// Native byte order and sizes: the bytes only travel between the ranks of one job.
class Writer {
 public:
  template <typename T>
  void value(const T& x) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&x), sizeof x);
  }
  template <typename T>
  void array(const T* data, size_t count) {
    value<uint64_t>(count);
    bytes_.append(reinterpret_cast<const char*>(data), count * sizeof(T));
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  T value() {
    T x;
    std::memcpy(&x, take(sizeof x), sizeof x);
    return x;
  }
  template <typename T>
  std::vector<T> vector() {
    const uint64_t count = value<uint64_t>();
    if (count > bytes_.size() / sizeof(T)) fail();
    std::vector<T> data(count);
    if (count) std::memcpy(data.data(), take(count * sizeof(T)), count * sizeof(T));
    return data;
  }
  std::string string() {
    const std::vector<char> chars = vector<char>();
    return std::string(chars.begin(), chars.end());
  }
  bool done() const { return bytes_.empty(); }

 private:
  const char* take(size_t n) {
    if (n > bytes_.size()) fail();
    const char* data = bytes_.data();
    bytes_.remove_prefix(n);
    return data;
  }
  [[noreturn]] static void fail() { throw std::runtime_error("sampled groups: the bytes end in the middle of a group"); }
  std::string_view bytes_;
};

}  // namespace

std::vector<double> SampledGroup::rewards() const {
  std::vector<double> rewards;
  for (const Sample& sample : samples) rewards.push_back(sample.reward);
  return rewards;
}

std::string write_groups(const std::vector<SampledGroup>& groups) {
  Writer out;
  out.value<uint64_t>(groups.size());
  for (const SampledGroup& group : groups) {
    out.value(group.prompt_index);
    out.array(group.prompt.data(), group.prompt.size());
    out.array(group.prompt_text.data(), group.prompt_text.size());
    out.value<uint64_t>(group.samples.size());
    for (const SampledGroup::Sample& sample : group.samples) {
      out.array(sample.tokens.data(), sample.tokens.size());
      out.array(sample.logprobs.data(), sample.logprobs.size());
      out.array(sample.text.data(), sample.text.size());
      out.value(sample.reward);
      out.value(sample.correct);
      out.value(sample.format);
    }
  }
  return out.take();
}

std::vector<SampledGroup> read_groups(std::string_view bytes) {
  Reader in(bytes);
  std::vector<SampledGroup> groups(in.value<uint64_t>());
  for (SampledGroup& group : groups) {
    group.prompt_index = in.value<uint64_t>();
    group.prompt = in.vector<int32_t>();
    group.prompt_text = in.string();
    group.samples.resize(in.value<uint64_t>());
    for (SampledGroup::Sample& sample : group.samples) {
      sample.tokens = in.vector<int32_t>();
      sample.logprobs = in.vector<float>();
      sample.text = in.string();
      sample.reward = in.value<double>();
      sample.correct = in.value<double>();
      sample.format = in.value<double>();
    }
  }
  if (!in.done()) throw std::runtime_error("sampled groups: bytes left over after the last group");
  return groups;
}

std::vector<SampledGroup> all_gather_groups(MPI_Comm comm, const std::vector<SampledGroup>& mine) {
  std::vector<SampledGroup> all;
  for (const std::string& bytes : all_gather_strings(comm, write_groups(mine), "the gathering of the kept groups")) {
    std::vector<SampledGroup> theirs = read_groups(bytes);
    all.insert(all.end(), std::make_move_iterator(theirs.begin()), std::make_move_iterator(theirs.end()));
  }
  return all;
}

}  // namespace tandem
