// The Booster's checkpoint IO for replicating plugins (DDP): every function is
// collective over the plugin's dp group. dp rank 0 writes (synchronously, or a
// host snapshot handed to a background writer), every rank reads, and one
// small all-reduce at the end turns an error on any rank into an error on all
// of them, so no rank is left waiting for a peer that already gave up.
//
// Files: the model is a Hugging Face directory (config.json + model.safetensors
// or shards + index, the bytes models::save_pretrained writes); the optimizer
// is optimizer.safetensors (or shards + index) whose metadata carries the
// state JSON, so tensors and JSON are published by the same atomic rename;
// the scheduler is one JSON file. Every file is written to a temp name and
// renamed, so a crash mid-save leaves the previous checkpoint loadable.
#include "colossus/booster/booster.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/pretrained.h"

#include <ATen/ops/full.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace colossus::booster {

namespace {

namespace fs = std::filesystem;

int64_t shard_bytes(const SaveOptions& options, const std::string& what, const std::string& dir) {
  if (options.size_per_shard_mb <= 0) {
    throw ConfigError(fmt::format("{}('{}'): size_per_shard_mb={} must be positive, e.g. 1024", what, dir,
                                  options.size_per_shard_mb));
  }
  return options.size_per_shard_mb * (int64_t{1} << 20);
}

std::string hf_torch_dtype(c10::ScalarType dtype) {
  if (auto name = hf_dtype_name(dtype)) return *name;
  throw CheckpointError(fmt::format("save_model: parameters of dtype {} have no Hugging Face torch_dtype; use "
                                    "float32, bfloat16, float16 or float64",
                                    c10::toString(dtype)));
}

void write_text_atomically(const std::string& path, const std::string& text) {
  checkpoint::io::TempFile out(path, checkpoint::io::temp_path_for(path));
  out.write(text.data(), text.size());
  out.publish();
}

// A regular file only (a FIFO would block the load forever); state JSON is
// small, so 64 MB is plenty.
std::string read_text(const std::string& path, const std::string& what) {
  return checkpoint::io::read_regular_file(path, std::size_t{64} << 20, what);
}

// What models::save_pretrained writes, from tensors alone (a host snapshot
// may be all that is left of the model when a background thread runs this):
// the weights, then config.json with torch_dtype, each atomically.
void write_model_dir(models::ModelConfig config, const checkpoint::NamedTensors& tensors, const std::string& dir,
                     int64_t max_shard_bytes) {
  if (tensors.empty()) throw CheckpointError(fmt::format("save_model('{}'): the model has no parameters", dir));
  hf_torch_dtype(tensors.front().second.scalar_type());  // refuse before writing anything
  checkpoint::save_sharded(dir, tensors, {.max_shard_bytes = max_shard_bytes});
  write_model_config(std::move(config), tensors.front().second.scalar_type(), dir);
}

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

void require_dir(const std::string& dir, const std::string& what, const std::string& expected) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw CheckpointError(
        fmt::format("{}: checkpoint directory '{}' does not exist; expected it to hold {}", what, dir, expected));
  }
}

// The file a model load reads first, for error messages: what loaders pick.
std::string model_source(const std::string& dir) {
  const fs::path single = fs::path(dir) / checkpoint::hf::single_file_name("model");
  return is_file(single) ? single.string() : (fs::path(dir) / checkpoint::hf::index_file_name("model")).string();
}

}  // namespace

void write_model_config(models::ModelConfig config, c10::ScalarType dtype, const std::string& dir) {
  const std::string name = hf_torch_dtype(dtype);
  std::visit(
      [&](auto& c) {
        c.extra.erase("dtype");
        c.extra["torch_dtype"] = fmt::format("\"{}\"", name);
      },
      config);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(fmt::format("save_model: cannot create '{}': {}", dir, ec.message()));
  write_text_atomically((fs::path(dir) / "config.json").string(), models::config_to_json(config));
}

void agree_on_success(cluster::ProcessGroup& group, std::exception_ptr local_error, const std::string& what) {
  if (group.size() > 1) {
    // failed rank + 1, or 0: the MAX names one failed rank to the others.
    const int failed_rank =
        static_cast<int>(group.all_reduce_scalar(local_error ? group.rank() + 1 : 0, cluster::ReduceOp::Max)) - 1;
    if (!local_error && failed_rank >= 0) {
      throw CheckpointError(fmt::format("{} failed on rank {} of the '{}' group (its error is in that rank's log)",
                                        what, failed_rank, group.name()));
    }
  }
  if (local_error) std::rethrow_exception(local_error);
}

void Booster::save_model(ModelWrapper& model, const std::string& dir, const SaveOptions& options) {
  if (auto* io = plugin_->checkpoint_io()) return io->save_model(model, dir, options);
  const int64_t max_shard_bytes = shard_bytes(options, "save_model", dir);  // on every rank: a ConfigError on all
  write_on_rank0(*plugin_->dp_group(), fmt::format("save_model('{}')", dir), [&] {
    impl_->model_writer.wait();  // the previous async model save, and its error
    const models::CausalLM& plain = model.unwrap();
    checkpoint::NamedTensors tensors = models::state_dict(plain);
    if (!options.use_async) {
      write_model_dir(plain.config(), tensors, dir, max_shard_bytes);
      return;
    }
    impl_->model_writer.submit([config = plain.config(), host = checkpoint::host_snapshot(tensors), dir,
                                max_shard_bytes] { write_model_dir(config, host, dir, max_shard_bytes); });
  });
}

void Booster::load_model(ModelWrapper& model, const std::string& dir) {
  if (auto* io = plugin_->checkpoint_io()) {
    io->load_model(model, dir);
  } else {
    read_on_all(*plugin_->dp_group(), fmt::format("load_model('{}')", dir), [&] {
      require_dir(dir, "load_model", "config.json and model.safetensors (or shards + model.safetensors.index.json)");
      const std::string source = model_source(dir);
      models::load_state_dict(model.unwrap(), checkpoint::load_state_dict(dir), source);
    });
  }
  // Every plugin alike: the optimizer's own copies (fp32 masters) follow the
  // loaded weights, or its next step would write the old ones back.
  model.parameters_changed();
}

void Booster::save_optimizer(optim::Optimizer& optimizer, const std::string& dir, const SaveOptions& options) {
  if (auto* io = plugin_->checkpoint_io()) return io->save_optimizer(optimizer, dir, options);
  const int64_t max_shard_bytes = shard_bytes(options, "save_optimizer", dir);
  write_on_rank0(*plugin_->dp_group(), fmt::format("save_optimizer('{}')", dir), [&] {
    impl_->optimizer_writer.wait();
    checkpoint::ShardOptions shard_options{.max_shard_bytes = max_shard_bytes, .prefix = kOptimizerPrefix};
    optim::OptimizerState state = optimizer.state_dict();
    shard_options.metadata[kOptimizerStateKey] = std::move(state.json);
    if (!options.use_async) {
      checkpoint::save_sharded(dir, state.tensors, shard_options);
      return;
    }
    // state_dict() tensors are fresh clones: on CPU they need no second copy.
    impl_->optimizer_writer.submit([host = checkpoint::host_snapshot(state.tensors, /*cpu_tensors_are_private=*/true),
                                    dir, shard_options] { checkpoint::save_sharded(dir, host, shard_options); });
  });
}

optim::OptimizerState read_optimizer_state(const std::string& dir) {
  const std::string single = (fs::path(dir) / checkpoint::hf::single_file_name(kOptimizerPrefix)).string();
  const std::string index = (fs::path(dir) / checkpoint::hf::index_file_name(kOptimizerPrefix)).string();
  require_dir(dir, "load_optimizer", fmt::format("{} (written by Booster::save_optimizer)", single));
  // The JSON is in every file's metadata; read it where loaders look first.
  std::string source = single;
  if (!is_file(single)) {
    if (!is_file(index)) {
      throw CheckpointError(
          fmt::format("load_optimizer: '{}' holds neither {} nor {} (written by "
                      "Booster::save_optimizer)",
                      dir, checkpoint::hf::single_file_name(kOptimizerPrefix),
                      checkpoint::hf::index_file_name(kOptimizerPrefix)));
    }
    const auto weight_map = checkpoint::hf::read_index(index).weight_map;
    if (weight_map.empty()) throw CheckpointError(fmt::format("load_optimizer: index '{}' lists no tensors", index));
    source = (fs::path(dir) / weight_map.begin()->second).string();
  }
  const auto file = checkpoint::SafetensorsFile::open(source);
  const auto json = file.metadata().find(kOptimizerStateKey);
  if (json == file.metadata().end()) {
    throw CheckpointError(
        fmt::format("load_optimizer: '{}' has no '{}' metadata; it was not written by "
                    "Booster::save_optimizer",
                    source, kOptimizerStateKey));
  }
  optim::OptimizerState state;
  state.json = json->second;
  for (auto& [name, tensor] : checkpoint::load_state_dict(dir, kOptimizerPrefix)) state.tensors.emplace_back(name, tensor);
  return state;
}

void load_optimizer_state(optim::Optimizer& optimizer, const std::string& dir) {
  optim::OptimizerState state = read_optimizer_state(dir);
  try {
    optimizer.load_state_dict(state);
  } catch (const CheckpointError& e) {
    // Name the file the state came from, so the user knows which one to replace.
    const std::string single = (fs::path(dir) / checkpoint::hf::single_file_name(kOptimizerPrefix)).string();
    const std::string from =
        is_file(single) ? single : (fs::path(dir) / checkpoint::hf::index_file_name(kOptimizerPrefix)).string();
    throw CheckpointError(fmt::format("load_optimizer('{}'): {}", from, e.what()));
  }
}

void Booster::load_optimizer(optim::Optimizer& optimizer, const std::string& dir) {
  if (auto* io = plugin_->checkpoint_io()) return io->load_optimizer(optimizer, dir);
  read_on_all(*plugin_->dp_group(), fmt::format("load_optimizer('{}')", dir),
              [&] { load_optimizer_state(optimizer, dir); });
}

void Booster::save_lr_scheduler(const optim::LRScheduler& scheduler, const std::string& path) {
  write_on_rank0(*plugin_->dp_group(), fmt::format("save_lr_scheduler('{}')", path), [&] {
    std::error_code ec;
    fs::create_directories(checkpoint::io::parent_dir(path), ec);
    if (ec)
      throw CheckpointError(
          fmt::format("save_lr_scheduler: cannot create the directory of '{}': {}", path, ec.message()));
    write_text_atomically(path, scheduler.state_dict());
  });
}

void Booster::load_lr_scheduler(optim::LRScheduler& scheduler, const std::string& path) {
  read_on_all(*plugin_->dp_group(), fmt::format("load_lr_scheduler('{}')", path), [&] {
    const std::string json = read_text(path, "load_lr_scheduler");
    try {
      scheduler.load_state_dict(json);
    } catch (const CheckpointError& e) {
      throw CheckpointError(fmt::format("load_lr_scheduler('{}'): {}", path, e.what()));
    }
  });
}

void Booster::wait_for_saves() {
  if (auto* io = plugin_->checkpoint_io()) io->wait_for_saves();
  std::exception_ptr error;
  for (auto* writer : {&impl_->model_writer, &impl_->optimizer_writer}) {
    try {
      writer->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  agree_on_success(*plugin_->dp_group(), error, "an asynchronous checkpoint save");
}

}  // namespace colossus::booster
