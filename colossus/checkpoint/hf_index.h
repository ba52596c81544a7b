// Internal to the checkpoint layer: Hugging Face's sharded layout, i.e. the
// file names (`model-00001-of-00003.safetensors`) and the index
// (`model.safetensors.index.json` = {"metadata": {"total_size"}, "weight_map"}).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace colossus::checkpoint::hf {

std::string single_file_name(std::string_view prefix);  // model.safetensors
std::string index_file_name(std::string_view prefix);   // model.safetensors.index.json
// 1-based shard k of n: model-0000k-of-0000n.safetensors
std::string shard_file_name(std::string_view prefix, int64_t k, int64_t n);
// Where a save puts shard k while it swaps checkpoints (see save_sharded).
std::string staged_shard_file_name(std::string_view prefix, int64_t k, int64_t n, int generation);
// True for a canonical or staged shard name of this prefix: the files a later
// save of the same prefix may replace or delete.
bool is_shard_file_name(std::string_view file_name, std::string_view prefix);

struct Index {
  std::string path;                               // of the index file
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name, relative to the index's dir
  int64_t total_size = -1;                        // bytes; -1 when the index does not say
};

// Throws CheckpointError naming the index for unreadable JSON, a missing or
// malformed weight_map, or a shard name that is absolute or contains "..".
Index read_index(const std::string& path);
// Atomically (temp file, then rename) writes the index as transformers does:
// sorted keys, 2-space indent.
void write_index(const std::string& path, const std::map<std::string, std::string>& weight_map, int64_t total_size);

}  // namespace colossus::checkpoint::hf
