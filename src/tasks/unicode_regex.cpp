#include "tasks/unicode_regex.h"

#include <oniguruma.h>

#include <memory>
#include <mutex>
#include <stdexcept>

namespace tandem {
namespace {

std::string onig_message(int code, OnigErrorInfo* info = nullptr) {
  OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
  onig_error_code_to_str(message, code, info);
  return reinterpret_cast<const char*>(message);
}

void initialize_oniguruma_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

const OnigUChar* bytes(const char* text) { return reinterpret_cast<const OnigUChar*>(text); }

}  // namespace

UnicodeRegex::UnicodeRegex(const std::string& pattern) : pattern_(pattern), regex_(nullptr) {
  initialize_oniguruma_once();
  OnigErrorInfo info;
  // The options and syntax of the Rust `onig` crate's Regex::new, which tokenizers uses.
  const int code =
      onig_new(&regex_, bytes(pattern.data()), bytes(pattern.data() + pattern.size()),
               ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (code != ONIG_NORMAL) {
    throw std::invalid_argument("invalid regular expression '" + pattern +
                                "': " + onig_message(code, &info));
  }
}

UnicodeRegex::~UnicodeRegex() {
  if (regex_ != nullptr) onig_free(regex_);
}

UnicodeRegex::UnicodeRegex(UnicodeRegex&& other) noexcept
    : pattern_(std::move(other.pattern_)), regex_(other.regex_) {
  other.regex_ = nullptr;
}

void UnicodeRegex::split_isolated(std::string_view text,
                                  std::vector<std::string_view>& pieces) const {
  const std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(
      onig_region_new(), [](OnigRegion* r) { onig_region_free(r, 1); });
  const OnigUChar* begin = bytes(text.data());
  const OnigUChar* end = begin + text.size();

  std::size_t piece_start = 0;   // start of the text not yet emitted
  std::size_t search_from = 0;
  std::ptrdiff_t last_match_end = -1;
  while (search_from <= text.size()) {
    const int found = onig_search(regex_, begin, end, begin + search_from, end, region.get(),
                                  ONIG_OPTION_NONE);
    if (found == ONIG_MISMATCH) break;
    if (found < 0) {
      throw std::runtime_error("regular expression '" + pattern_ +
                               "' failed: " + onig_message(found));
    }
    const auto match_begin = static_cast<std::size_t>(region->beg[0]);
    const auto match_end = static_cast<std::size_t>(region->end[0]);
    // Like the onig crate's find_iter: an empty match right after the previous match is
    // skipped by stepping one character forward, so the search always progresses.
    if (match_begin == match_end && static_cast<std::ptrdiff_t>(match_end) == last_match_end) {
      if (search_from == text.size()) break;
      std::size_t step = 1;
      while (search_from + step < text.size() &&
             (static_cast<unsigned char>(text[search_from + step]) & 0xC0) == 0x80) {
        ++step;
      }
      search_from += step;
      continue;
    }
    if (match_begin > piece_start) {
      pieces.push_back(text.substr(piece_start, match_begin - piece_start));
    }
    if (match_end > match_begin) {
      pieces.push_back(text.substr(match_begin, match_end - match_begin));
    }
    piece_start = match_end;
    search_from = match_end;
    last_match_end = static_cast<std::ptrdiff_t>(match_end);
  }
  if (piece_start < text.size()) pieces.push_back(text.substr(piece_start));
}

}  // namespace tandem
