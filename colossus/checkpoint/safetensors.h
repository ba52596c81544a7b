// safetensors reading (mmap, zero-copy) and writing (atomic: temp file, then
// rename), plus Hugging Face's sharded layout (model.safetensors.index.json).
// Interface agreed before implementation; see docs/architecture.md.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace colossus::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One mapped .safetensors file. Tensors returned by get() are CPU views into
// the mapping and keep it alive (a copy only where the data is not aligned for
// its dtype). The mapping is private: writing into a returned tensor never
// changes the file, though a later get() of that tensor sees the write while
// a view of it is alive (where the kernel refuses writable private mappings,
// i.e. strict overcommit, the views are read-only and must not be written).
// When the last view of a tensor dies, its pages leave the process's RSS (a
// loader that copies tensors out one by one holds about one at a time). Every
// malformed input (truncated file, bad header JSON, offsets out of range or
// overlapping, unknown dtype, shape/size mismatch) throws CheckpointError
// naming the file and tensor. Thread-safe: all members are const.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const;
  std::vector<std::string> keys() const;  // in file order
  bool contains(const std::string& name) const;
  at::Tensor get(const std::string& name) const;
  c10::ScalarType dtype(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const;

  struct Impl;

 private:
  explicit SafetensorsFile(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Writes one file atomically. Tensors may live on any device and be
// non-contiguous; names must be unique.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct ShardOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;  // HF's default 5 GB
  std::string prefix = "model";                // model.safetensors / model-00001-of-00002.safetensors
  // Written into every shard. "format": "pt" is added unless given, because
  // transformers refuses shards whose metadata lacks a known format.
  std::map<std::string, std::string> metadata = {};
};

// Writes `dir/<prefix>.safetensors`, or numbered shards plus
// `dir/<prefix>.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}).
// The index is written last, so a half-written checkpoint has no index.
// Tensors go into shards in the given order; a shard is closed when the next
// tensor would take it past max_shard_bytes (a bigger tensor gets its own).
// Crash-safe: at every instant `dir` holds a loadable checkpoint, the previous
// one until the new one is complete; stale files of the previous save with
// this prefix are removed only after that.
void save_sharded(const std::string& dir, const NamedTensors& tensors, const ShardOptions& options = {});

// Loads a single file, or a directory with an index or a single model file.
// Throws CheckpointError on a missing shard named by the index.
// `path` may be: a .safetensors file; a `*.index.json` file; a directory with
// `<prefix>.safetensors` (preferred, as transformers does) or
// `<prefix>.safetensors.index.json`. Tensors are zero-copy views (see
// SafetensorsFile).
std::map<std::string, at::Tensor> load_state_dict(const std::string& path, const std::string& prefix = "model");

// Like load_state_dict, but only `names` (opening only the shards that hold
// them); a name the checkpoint lacks throws CheckpointError listing them all.
std::map<std::string, at::Tensor> load_tensors(const std::string& path, const std::vector<std::string>& names,
                                               const std::string& prefix = "model");

// Every tensor of a checkpoint (any `path` load_state_dict takes), its files
// mapped once. get() returns a fresh view each time, so a loader that copies
// tensors out one at a time (lazy init) keeps only the one it is copying
// resident: the pages go when that view dies (see SafetensorsFile).
class CheckpointFiles {
 public:
  static CheckpointFiles open(const std::string& path, const std::string& prefix = "model");
  const std::string& path() const { return path_; }
  std::vector<std::string> keys() const;
  bool contains(const std::string& name) const { return file_of_.contains(name); }
  at::Tensor get(const std::string& name) const;  // CheckpointError naming a missing one

 private:
  std::string path_;
  std::map<std::string, SafetensorsFile> file_of_;
};

// Compares a loaded state dict with what a model expects. Mismatched dtypes or
// shapes of common names always throw; with `strict`, so do missing and
// unexpected names. The CheckpointError lists every problem: name, expected,
// got (as PyTorch's load_state_dict does).
void check_state_dict(const std::map<std::string, at::Tensor>& loaded, const NamedTensors& expected, bool strict);

}  // namespace colossus::checkpoint
