// Loading whole checkpoints (a file, an index and its shards, or a directory
// holding either) and checking a loaded state dict against a model's.
#include "colossus/checkpoint/dtypes.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>

namespace colossus::checkpoint {

namespace {

namespace fs = std::filesystem;

// Without an error_code, fs::exists throws filesystem_error (e.g. for EACCES);
// treating "cannot tell" as absent gives a CheckpointError later instead.
bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

struct Source {
  bool is_index = false;
  std::string path;  // a .safetensors file or an index
};

Source resolve(const std::string& path, const std::string& prefix) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (!fs::exists(status)) throw CheckpointError(fmt::format("checkpoint '{}' does not exist", path));
  if (fs::is_directory(status)) {
    // The single file first, as transformers' from_pretrained does: the save
    // protocol relies on both agreeing which of the two is live.
    // A symlink may not lead out of the folder (confined_path throws). The
    // path itself stays unresolved: an index's shards are named relative to
    // the folder, not to where a linked index file lives (HF's hub cache).
    std::string single = (fs::path(path) / hf::single_file_name(prefix)).string();
    if (exists(single)) {
      io::confined_path(path, single);
      return {false, single};
    }
    std::string index = (fs::path(path) / hf::index_file_name(prefix)).string();
    if (exists(index)) {
      io::confined_path(path, index);
      return {true, index};
    }
    throw CheckpointError(fmt::format("no checkpoint in directory '{}': looked for '{}' and '{}'", path,
                                      hf::single_file_name(prefix), hf::index_file_name(prefix)));
  }
  return {path.ends_with(".index.json"), path};
}

// Every tensor of `source`, or only `names` (nullptr: all).
std::map<std::string, at::Tensor> load(const Source& source, const std::vector<std::string>* names) {
  std::map<std::string, at::Tensor> tensors;
  std::vector<std::string> missing;
  if (!source.is_index) {
    auto file = SafetensorsFile::open(source.path);
    for (const auto& name : names ? *names : file.keys()) {
      if (file.contains(name)) {
        tensors.emplace(name, file.get(name));
      } else {
        missing.push_back(name);
      }
    }
  } else {
    hf::Index index = hf::read_index(source.path);
    std::map<std::string, std::vector<std::string>> by_shard;
    if (names) {
      for (const auto& name : *names) {
        auto it = index.weight_map.find(name);
        if (it == index.weight_map.end()) {
          missing.push_back(name);
        } else {
          by_shard[it->second].push_back(name);
        }
      }
    } else {
      for (const auto& [name, shard] : index.weight_map) by_shard[shard].push_back(name);
    }
    fs::path dir = io::parent_dir(source.path);
    for (const auto& [shard, shard_names] : by_shard) {
      std::string shard_path = (dir / shard).string();
      if (!exists(shard_path)) {
        throw CheckpointError(
            fmt::format("shard '{}' named by index '{}' is missing (it should hold {} tensors, "
                        "e.g. '{}')",
                        shard_path, source.path, shard_names.size(), shard_names.front()));
      }
      // read_index refused "..", absolute names; this catches symlinks.
      io::confined_path(dir.string(), shard_path);
      auto file = SafetensorsFile::open(shard_path);
      for (const auto& name : shard_names) {
        if (!file.contains(name)) {
          throw CheckpointError(fmt::format("index '{}' puts tensor '{}' in shard '{}', which does not hold it",
                                            source.path, name, shard_path));
        }
        tensors.emplace(name, file.get(name));
      }
    }
  }
  if (!missing.empty()) {
    throw CheckpointError(fmt::format("checkpoint '{}' lacks {} requested tensors: {}", source.path, missing.size(),
                                      fmt::join(missing, ", ")));
  }
  return tensors;
}

std::string describe(const at::Tensor& tensor) {
  auto info = dtype_from_scalar_type(tensor.scalar_type());
  std::string dtype = info ? std::string(info->name) : std::string(c10::toString(tensor.scalar_type()));
  return fmt::format("{} [{}]", dtype, fmt::join(tensor.sizes(), ", "));
}

// At most `limit` items, then "... and N more": a model with thousands of
// missing tensors still gives a readable message.
std::string first_items(const std::vector<std::string>& items, std::size_t limit = 20) {
  std::vector<std::string_view> shown(items.begin(), items.begin() + std::min(limit, items.size()));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (items.size() > limit) text += fmt::format(", ... and {} more", items.size() - limit);
  return text;
}

}  // namespace

CheckpointFiles CheckpointFiles::open(const std::string& path, const std::string& prefix) {
  CheckpointFiles files;
  files.path_ = path;
  const Source source = resolve(path, prefix);
  if (!source.is_index) {
    auto file = SafetensorsFile::open(source.path);
    for (const auto& name : file.keys()) files.file_of_.emplace(name, file);
    return files;
  }
  const hf::Index index = hf::read_index(source.path);
  const fs::path dir = io::parent_dir(source.path);
  std::map<std::string, SafetensorsFile> shards;
  for (const auto& [name, shard] : index.weight_map) {
    auto it = shards.find(shard);
    if (it == shards.end()) {
      const std::string shard_path = (dir / shard).string();
      if (!exists(shard_path)) {
        throw CheckpointError(fmt::format("shard '{}' named by index '{}' is missing (it should hold e.g. '{}')",
                                          shard_path, source.path, name));
      }
      io::confined_path(dir.string(), shard_path);
      it = shards.emplace(shard, SafetensorsFile::open(shard_path)).first;
    }
    if (!it->second.contains(name)) {
      throw CheckpointError(fmt::format("index '{}' puts tensor '{}' in shard '{}', which does not hold it",
                                        source.path, name, it->second.path()));
    }
    files.file_of_.emplace(name, it->second);
  }
  return files;
}

std::vector<std::string> CheckpointFiles::keys() const {
  std::vector<std::string> names;
  for (const auto& item : file_of_) names.push_back(item.first);
  return names;
}

at::Tensor CheckpointFiles::get(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw CheckpointError(fmt::format("checkpoint '{}' has no tensor '{}'", path_, name));
  return it->second.get(name);
}

std::map<std::string, at::Tensor> load_state_dict(const std::string& path, const std::string& prefix) {
  return load(resolve(path, prefix), nullptr);
}

std::map<std::string, at::Tensor> load_tensors(const std::string& path, const std::vector<std::string>& names,
                                               const std::string& prefix) {
  return load(resolve(path, prefix), &names);
}

void check_state_dict(const std::map<std::string, at::Tensor>& loaded, const NamedTensors& expected, bool strict) {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> mismatched;  // "name: expected X, got Y"
  std::set<std::string_view> expected_names;
  for (const auto& [name, want] : expected) {
    expected_names.insert(name);
    auto it = loaded.find(name);
    if (it == loaded.end()) {
      missing.push_back(name);
      continue;
    }
    const at::Tensor& got = it->second;
    if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes()) {
      mismatched.push_back(fmt::format("'{}' expected {}, got {}", name, describe(want), describe(got)));
    }
  }
  for (const auto& [name, tensor] : loaded) {
    if (!expected_names.contains(name)) unexpected.push_back(name);
  }
  std::vector<std::string> problems;
  if (strict && !missing.empty())
    problems.push_back(fmt::format("missing {}: {}", missing.size(), first_items(missing)));
  if (strict && !unexpected.empty()) {
    problems.push_back(fmt::format("unexpected {}: {}", unexpected.size(), first_items(unexpected)));
  }
  if (!mismatched.empty()) {
    problems.push_back(fmt::format("mismatched {}: {}", mismatched.size(), first_items(mismatched)));
  }
  if (!problems.empty()) {
    throw CheckpointError(fmt::format("state dict does not match the model ({}): {}", strict ? "strict" : "non-strict",
                                      fmt::join(problems, "; ")));
  }
}

}  // namespace colossus::checkpoint
