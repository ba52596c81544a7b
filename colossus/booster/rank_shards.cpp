// Per-rank sharded checkpoints (see rank_shards.h).
#include "colossus/booster/rank_shards.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include "colossus/booster/booster_impl.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/core/errors.h"

namespace colossus::booster {

namespace {

namespace fs = std::filesystem;
namespace hf = checkpoint::hf;

bool path_exists(const fs::path& path) {
  std::error_code ec;  // "cannot tell" counts as absent
  return fs::exists(path, ec);
}

// The shard files the checkpoint loaders would read now: none while a single
// file shadows the index; a corrupt index protects nothing (it loads nothing).
std::set<std::string> live_files(const std::string& dir, const std::string& prefix) {
  if (path_exists(fs::path(dir) / hf::single_file_name(prefix))) return {};
  const fs::path index = fs::path(dir) / hf::index_file_name(prefix);
  if (!path_exists(index)) return {};
  std::set<std::string> files;
  try {
    for (const auto& [name, file] : hf::read_index(index.string()).weight_map) files.insert(file);
  } catch (const CheckpointError&) {
    return {};
  }
  return files;
}

// File `r` of `n`: the canonical shard name unless the live checkpoint still
// needs it (a save over a checkpoint with the same rank count), then a staged
// name it does not use. Every rank computes the same names from the same
// live index, which only rank 0 changes, after every file is written.
std::string file_name(const std::set<std::string>& live, const std::string& prefix, int r, int n) {
  std::string name = hf::shard_file_name(prefix, r + 1, n);
  for (int generation = 0; live.contains(name); ++generation) {
    name = hf::staged_shard_file_name(prefix, r + 1, n, generation);
  }
  return name;
}

}  // namespace

void save_rank_shards(cluster::ProcessGroup& group, const RankShard& shard, const std::string& dir,
                      const std::string& prefix, const checkpoint::NamedTensors& mine,
                      std::map<std::string, std::string> metadata, const std::string& what) {
  metadata.emplace("format", "pt");  // transformers refuses shards without it
  std::set<std::string> live;
  std::exception_ptr error;
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw CheckpointError(fmt::format("{}: cannot create '{}': {}", what, dir, ec.message()));
    live = live_files(dir, prefix);
    if (shard.writes) {
      const std::string path = (fs::path(dir) / file_name(live, prefix, shard.file_rank, shard.file_count)).string();
      checkpoint::save_safetensors(path, mine, metadata);
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_success(group, error, what);  // every file is on disk
  write_on_rank0(group, what, [&] {
    std::map<std::string, std::string> weight_map;
    std::set<std::string> files;
    int64_t total_size = 0;
    for (int r = 0; r < shard.file_count; ++r) {
      const std::string name = file_name(live, prefix, r, shard.file_count);
      const auto file = checkpoint::SafetensorsFile::open((fs::path(dir) / name).string());
      files.insert(name);
      for (const auto& key : file.keys()) {
        if (!weight_map.emplace(key, name).second) {
          throw CheckpointError(fmt::format("{}: tensor '{}' was written by two ranks ('{}' and '{}')", what, key,
                                            weight_map.at(key), name));
        }
        int64_t numel = 1;
        for (int64_t d : file.shape(key)) numel *= d;
        total_size += numel * static_cast<int64_t>(c10::elementSize(file.dtype(key)));
      }
    }
    hf::write_index((fs::path(dir) / hf::index_file_name(prefix)).string(), weight_map, total_size);
    // Commit: loaders prefer a single file to the index.
    checkpoint::io::remove_file((fs::path(dir) / hf::single_file_name(prefix)).string());
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (hf::is_shard_file_name(name, prefix) && !files.contains(name)) checkpoint::io::remove_file(entry.path().string());
    }
    checkpoint::io::fsync_dir(dir);
  });
}

std::vector<int> writer_ranks_by_bytes(const checkpoint::NamedTensors& tensors, int ranks) {
  int64_t total = 0;
  for (const auto& [name, tensor] : tensors) total += tensor.nbytes();
  std::vector<int> writers;
  writers.reserve(tensors.size());
  int64_t before = 0;
  for (const auto& [name, tensor] : tensors) {
    // The rank whose equal share holds this tensor's middle byte.
    const int64_t middle = before + static_cast<int64_t>(tensor.nbytes()) / 2;
    writers.push_back(total == 0 ? 0 : static_cast<int>(std::min<int64_t>(ranks - 1, middle * ranks / total)));
    before += tensor.nbytes();
  }
  return writers;
}

}  // namespace colossus::booster
