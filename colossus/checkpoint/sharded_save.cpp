// save_sharded: Hugging Face's layout, written so that a crash at any point
// leaves a loadable checkpoint in the directory. Loaders (ours and
// transformers') take `<prefix>.safetensors` when it exists, else the index, so
// the commit point of a save is the rename that makes the new single file or
// the new index visible, and the removal of an old single file that would
// shadow a new index. Shards are fully written and flushed under temp names
// before any of that happens.
//
// The one hard case is a new shard that must take the name of a shard the
// live index still needs (same shard count as the previous save): renaming
// over it would break the previous checkpoint before the new index exists.
// Then the new shards are first published under staged names with an index
// of their own (commit 1), linked to their canonical names, and the final
// index is published (commit 2).
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/checkpoint/safetensors_writer.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <filesystem>
#include <set>
#include <system_error>

namespace colossus::checkpoint {

namespace {

namespace fs = std::filesystem;

std::string join(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

bool exists(const std::string& path) {
  std::error_code ec;  // "cannot tell" counts as absent rather than throwing filesystem_error
  return fs::exists(path, ec);
}

void validate(const std::string& dir, const ShardOptions& options) {
  if (options.prefix.empty() || options.prefix.find('/') != std::string::npos) {
    throw CheckpointError(fmt::format("save_sharded('{}'): prefix '{}' must be a non-empty file name, like \"model\"",
                                      dir, options.prefix));
  }
  if (options.max_shard_bytes <= 0) {
    throw CheckpointError(fmt::format("save_sharded('{}'): max_shard_bytes is {}, must be positive (e.g. 5 << 30)", dir,
                                      options.max_shard_bytes));
  }
}

// Indices into `tensors`, one list per shard: in order, a new shard whenever
// the next tensor would overflow the current one.
std::vector<std::vector<std::size_t>> assign_shards(const std::string& dir, const NamedTensors& tensors,
                                                    int64_t max_shard_bytes, int64_t& total_bytes) {
  std::vector<std::vector<std::size_t>> shards(1);
  std::set<std::string_view> seen;
  int64_t shard_bytes = 0;
  total_bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, tensor] = tensors[i];
    if (!seen.insert(name).second) {
      throw CheckpointError(fmt::format("save_sharded('{}'): tensor name '{}' appears twice", dir, name));
    }
    int64_t bytes = stored_bytes(dir, name, tensor);
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  return shards;
}

// The files the checkpoint that would load right now depends on (a single
// file shadows any index; a corrupt index protects nothing: it loads nothing).
std::set<std::string> live_index_files(const std::string& dir, const std::string& prefix) {
  if (exists(join(dir, hf::single_file_name(prefix)))) return {};
  std::string index_path = join(dir, hf::index_file_name(prefix));
  if (!exists(index_path)) return {};
  std::set<std::string> files;
  try {
    for (const auto& [name, file] : hf::read_index(index_path).weight_map) files.insert(file);
  } catch (const CheckpointError&) {
    return {};
  }
  return files;
}

void remove_stale_shards(const std::string& dir, const std::string& prefix, const std::set<std::string>& keep) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (hf::is_shard_file_name(name, prefix) && !keep.contains(name)) stale.push_back(entry.path().string());
  }
  if (ec) throw CheckpointError(fmt::format("cannot list checkpoint directory '{}': {}", dir, ec.message()));
  for (const auto& path : stale) io::remove_file(path);
}

void save_single(const std::string& dir, const NamedTensors& tensors, const std::string& prefix,
                 const std::map<std::string, std::string>& metadata) {
  save_safetensors(join(dir, hf::single_file_name(prefix)), tensors, metadata);
  io::fault_point("single published");
  io::remove_file(join(dir, hf::index_file_name(prefix)));
  io::fault_point("index removed");
  remove_stale_shards(dir, prefix, {});
  io::fsync_dir(dir);
}

}  // namespace

void save_sharded(const std::string& dir, const NamedTensors& tensors, const ShardOptions& options) {
  validate(dir, options);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(fmt::format("cannot create checkpoint directory '{}': {}", dir, ec.message()));
  auto metadata = options.metadata;
  metadata.try_emplace("format", "pt");
  const std::string& prefix = options.prefix;

  int64_t total_bytes = 0;
  auto shards = assign_shards(dir, tensors, options.max_shard_bytes, total_bytes);
  if (shards.size() == 1) {
    save_single(dir, tensors, prefix, metadata);
    return;
  }

  const auto n = static_cast<int64_t>(shards.size());
  std::vector<std::string> names;       // canonical shard file names
  std::vector<std::string> temp_paths;  // where each shard is written first
  std::vector<std::string> staged_paths;
  std::map<std::string, std::string> weight_map;
  for (int64_t k = 0; k < n; ++k) {
    names.push_back(hf::shard_file_name(prefix, k + 1, n));
    for (std::size_t i : shards[k]) weight_map[tensors[i].first] = names.back();
  }
  // On failure, take back what this save created under temporary names; what
  // it already published belongs to a valid checkpoint.
  auto discard_temps = [&] {
    for (const auto& path : temp_paths) fs::remove(path, ec);
  };
  try {
    for (int64_t k = 0; k < n; ++k) {
      NamedTensors shard;
      for (std::size_t i : shards[k]) shard.push_back(tensors[i]);
      std::string final_path = join(dir, names[k]);
      io::TempFile out(final_path, io::temp_path_for(final_path));
      temp_paths.push_back(out.temp_path());
      write_safetensors(out, shard, metadata);
      out.finish();
      io::fault_point("shard written");
    }

    std::set<std::string> live = live_index_files(dir, prefix);
    bool replaces_live_shard = false;
    for (const auto& name : names) replaces_live_shard = replaces_live_shard || live.contains(name);
    if (replaces_live_shard) {
      int generation = 0;
      auto generation_is_live = [&](int g) {
        for (int64_t k = 0; k < n; ++k) {
          if (live.contains(hf::staged_shard_file_name(prefix, k + 1, n, g))) return true;
        }
        return false;
      };
      while (generation_is_live(generation)) ++generation;
      std::map<std::string, std::string> staged_map;
      for (int64_t k = 0; k < n; ++k) {
        std::string staged_name = hf::staged_shard_file_name(prefix, k + 1, n, generation);
        for (std::size_t i : shards[k]) staged_map[tensors[i].first] = staged_name;
        staged_paths.push_back(join(dir, staged_name));
        io::rename_file(temp_paths[k], staged_paths.back());
        io::fault_point("shard staged");
      }
      io::fsync_dir(dir);
      hf::write_index(join(dir, hf::index_file_name(prefix)), staged_map, total_bytes);
      io::fault_point("staged index published");
      for (int64_t k = 0; k < n; ++k) {
        io::link_or_copy(staged_paths[k], join(dir, names[k]));
        io::fault_point("shard linked");
      }
    } else {
      for (int64_t k = 0; k < n; ++k) {
        io::rename_file(temp_paths[k], join(dir, names[k]));
        io::fault_point("shard published");
      }
    }
    io::fsync_dir(dir);
  } catch (...) {
    discard_temps();
    throw;
  }
  hf::write_index(join(dir, hf::index_file_name(prefix)), weight_map, total_bytes);
  io::fault_point("index published");
  io::remove_file(join(dir, hf::single_file_name(prefix)));
  io::fault_point("single removed");
  remove_stale_shards(dir, prefix, std::set<std::string>(names.begin(), names.end()));
  io::fsync_dir(dir);
}

}  // namespace colossus::checkpoint
