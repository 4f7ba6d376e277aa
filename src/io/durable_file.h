// Files that appear whole or not at all, through a crash or a full disk: written under a
// temporary name, fsynced, renamed into place, and the folder fsynced so the rename
// itself survives a power cut.
#pragma once
#include <filesystem>

namespace tandem {

// fsync of a file makes its bytes durable; fsync of its folder makes a rename durable.
void fsync_path(const std::filesystem::path& path, bool is_folder);

// Copies `from` to `to` as above (the temporary is `.<to's name>.tmp` beside it, removed
// again on failure). copy_file_range lets the file system share the blocks (a reflink on
// XFS and Btrfs) or copy them without a trip through user space.
void durable_copy(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace tandem
