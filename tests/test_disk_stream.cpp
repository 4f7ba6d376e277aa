// DiskStream's two ways to the disk put the same bytes at the same offsets and leave every
// byte around the ranges as it was: direct writes of the whole 4 KiB blocks (past the page
// cache, from the caller's memory or through the staging buffer) with the partial blocks
// cached, and the paced buffered writes that a filesystem refusing O_DIRECT gets.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/disk_stream.h"
#include "support.h"

using namespace tandem;
using tandem::testing::read_text;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kBlock = DiskStream::kBlockBytes;

// A range to write: its file offset and size, and where its bytes lie in memory relative to
// a page boundary (so its whole blocks are either at the memory alignment a direct write
// asks for or off it).
struct Range {
  uint64_t offset;
  size_t bytes;
  size_t memory_offset;
};

// Each kind of range a checkpoint has, in a 70 MiB file.
const std::vector<Range> kRanges = {
    {2 * kBlock, 3 * kBlock + 123, 0},              // block-aligned start, partial last block
    {8 * kBlock + 100, 5 * kBlock + 7, 0},          // partial blocks at both ends, memory off the boundary
    {20 * kBlock + 100, 5 * kBlock, 100},           // the same, memory in step with the file
    {1 * kMiB, 66 * kMiB + 1000, 4},                // two 64 MiB pieces, through the staging buffer
    {68 * kMiB + kBlock, 3000, 0},                  // less than a block
    {69 * kMiB + 10, 100, 0},                       // inside one block
};
constexpr size_t kFileBytes = 70 * kMiB;
// The whole blocks of kRanges: what goes past the page cache.
constexpr uint64_t kDirectBytes = 3 * kBlock + 4 * kBlock + 4 * kBlock + 66 * kMiB;

struct AlignedBytes {
  std::unique_ptr<char, decltype(&std::free)> memory{nullptr, &std::free};
  char* data = nullptr;
};

// `range`'s bytes (random, seeded by its offset) at its memory offset from a page.
AlignedBytes bytes_of(const Range& range) {
  AlignedBytes bytes;
  const size_t size = (range.memory_offset + range.bytes + kBlock) / kBlock * kBlock;
  bytes.memory.reset(static_cast<char*>(std::aligned_alloc(kBlock, size)));
  bytes.data = bytes.memory.get() + range.memory_offset;
  std::mt19937_64 random(range.offset);
  for (size_t i = 0; i < range.bytes; ++i) bytes.data[i] = static_cast<char>(random());
  return bytes;
}

// The file before the writes: a pattern, as the metadata around a checkpoint's tensors.
std::string background() {
  std::string text(kFileBytes, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 23);
  return text;
}

// Writes kRanges into a fresh copy of background() at `path`; returns the stream's
// direct bytes, or -1 when the filesystem took no O_DIRECT from the start.
int64_t write_ranges(const fs::path& path, DiskWrites writes) {
  tandem::testing::write_text(path, background());
  DiskStream stream(path, writes);
  const bool direct = stream.direct();
  for (const Range& range : kRanges) stream.write_at(range.offset, bytes_of(range).data, range.bytes);
  const int64_t direct_bytes = direct ? static_cast<int64_t>(stream.direct_bytes()) : -1;
  stream.close();
  return direct_bytes;
}

std::string expected_file() {
  std::string text = background();
  for (const Range& range : kRanges) text.replace(range.offset, range.bytes, bytes_of(range).data, range.bytes);
  return text;
}

// How many of the pages of [offset, offset + bytes) of `path` are in the page cache.
size_t cached_pages(const fs::path& path, uint64_t offset, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  void* mapping = ::mmap(nullptr, kFileBytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  EXPECT_NE(mapping, MAP_FAILED);
  std::vector<unsigned char> resident(bytes / kBlock);
  EXPECT_EQ(::mincore(static_cast<char*>(mapping) + offset, bytes, resident.data()), 0);
  ::munmap(mapping, kFileBytes);
  size_t cached = 0;
  for (unsigned char page : resident) cached += page & 1;
  return cached;
}

}  // namespace

TEST(DiskStream, DirectAndBufferedWritesMakeTheSameFile) {
  static_assert(kBlock == 4096, "kDirectBytes counts 4 KiB blocks");
  TempDir dir;
  const std::string expected = expected_file();
  EXPECT_EQ(write_ranges(dir / "buffered", DiskWrites::Buffered), -1);
  EXPECT_TRUE(read_text(dir / "buffered") == expected);
  const int64_t direct_bytes = write_ranges(dir / "direct", DiskWrites::Direct);
  if (direct_bytes < 0) GTEST_SKIP() << dir.path() << ": the filesystem takes no O_DIRECT; its fallback was checked";
  EXPECT_EQ(direct_bytes, static_cast<int64_t>(kDirectBytes));
  // Past the page cache: the large range's pages (cached when the file was made) are not.
  EXPECT_EQ(cached_pages(dir / "direct", 1 * kMiB, 66 * kMiB), 0u);
  EXPECT_TRUE(read_text(dir / "direct") == expected);
}

TEST(DiskStream, AMissingFileIsAnErrorNamingIt) {
  TempDir dir;
  try {
    DiskStream stream(dir / "absent");
    FAIL() << "opened a file that does not exist";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find((dir / "absent").string()), std::string::npos) << error.what();
  }
}
