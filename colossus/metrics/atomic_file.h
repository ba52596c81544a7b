// Whole-file replacement that readers never see half-written: write a temp file
// beside the target, flush it to disk, rename it over the target.
#pragma once
#include <filesystem>
#include <string_view>

namespace colossus::metrics {

// Replaces `path` with `content` atomically; creates missing parent folders.
// Throws ConfigError naming the path when the folder is not writable.
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

}  // namespace colossus::metrics
