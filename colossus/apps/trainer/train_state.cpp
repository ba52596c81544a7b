#include "colossus/apps/trainer/train_state.h"

#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace colossus::apps {

void TrainState::save(const std::string& path) const {
  nlohmann::json j{{"step", step},
                   {"tokens_seen", tokens_seen},
                   {"data_epoch", data_epoch},
                   {"data_position", data_position},
                   {"dp_size", dp_size},
                   {"micro_batch", micro_batch},
                   {"grad_accum", grad_accum},
                   {"seq_len", seq_len},
                   {"last_loss", last_loss}};
  if (!sft_position.empty()) j["sft_position"] = nlohmann::json::parse(sft_position);
  const auto text = j.dump(2) + "\n";
  checkpoint::io::TempFile out(path, checkpoint::io::temp_path_for(path));
  out.write(text.data(), text.size());
  out.publish();
}

TrainState TrainState::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw CheckpointError(fmt::format("{}: cannot read the training state (missing file)", path));
  }
  const std::string text = checkpoint::io::read_regular_file(path, 1 << 20, "training state");
  TrainState s;
  try {
    auto j = nlohmann::json::parse(text);
    s.step = j.at("step").get<int64_t>();
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    s.data_epoch = j.at("data_epoch").get<int64_t>();
    s.data_position = j.at("data_position").get<int64_t>();
    s.dp_size = j.at("dp_size").get<int64_t>();
    s.micro_batch = j.at("micro_batch").get<int64_t>();
    s.grad_accum = j.at("grad_accum").get<int64_t>();
    s.seq_len = j.at("seq_len").get<int64_t>();
    s.last_loss = j.value("last_loss", 0.0);
    if (auto it = j.find("sft_position"); it != j.end()) s.sft_position = it->dump();
  } catch (const nlohmann::json::parse_error& e) {
    // Not e.what(): it quotes the bytes last read.
    throw CheckpointError(fmt::format("{}: the training state is not valid JSON (syntax error at byte {})", path,
                                      e.byte));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: the training state is malformed: {}", path, e.what()));
  }
  s.validate(path);
  return s;
}

void TrainState::validate(const std::string& path) const {
  auto bad = [&](std::string_view field, auto value, std::string_view rule) {
    throw CheckpointError(fmt::format("{}: {} = {} is invalid; {}", path, field, value, rule));
  };
  if (step < 0) bad("step", step, "it counts optimizer steps and is >= 0");
  if (dp_size < 1) bad("dp_size", dp_size, "it is >= 1");
  if (micro_batch < 1) bad("micro_batch", micro_batch, "it is >= 1");
  if (grad_accum < 1) bad("grad_accum", grad_accum, "it is >= 1");
  if (seq_len < 1) bad("seq_len", seq_len, "it is >= 1");
  if (data_epoch < 0) bad("data_epoch", data_epoch, "it is >= 0");
  if (data_position < 0) bad("data_position", data_position, "it is >= 0");
  if (!std::isfinite(last_loss)) bad("last_loss", last_loss, "a published checkpoint's loss is finite");
  if (tokens_seen < 0) bad("tokens_seen", tokens_seen, "it is >= 0");
  // SFT batches vary in length: no token count follows from the step.
  if (!sft_position.empty()) return;
  // Every step consumes the same global batch, so the token count follows
  // from the step and the layout; anything else is a corrupt (or huge) step.
  int64_t expected = step;
  bool overflow = false;
  for (int64_t factor : {dp_size, micro_batch, grad_accum, seq_len}) {
    overflow = overflow || __builtin_mul_overflow(expected, factor, &expected);
  }
  if (overflow || expected != tokens_seen) {
    throw CheckpointError(fmt::format("{}: tokens_seen = {} does not match step {} x dp_size {} x micro_batch {} x "
                                      "grad_accum {} x seq_len {}; the training state is corrupt",
                                      path, tokens_seen, step, dp_size, micro_batch, grad_accum, seq_len));
  }
}

namespace {

// Generators are shared handles; torch locks one while changing its state.
void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.clone());
}

}  // namespace

void save_rng_state(const std::string& path, c10::Device device) {
  checkpoint::NamedTensors tensors;
  tensors.emplace_back("cpu", at::detail::getDefaultCPUGenerator().get_state());
  // Only this rank's own GPU: touching another device's generator would
  // create a context on it.
  if (device.is_cuda()) tensors.emplace_back("cuda", at::globalContext().defaultGenerator(device).get_state());
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  checkpoint::save_safetensors(path, tensors);
}

void load_rng_state(const std::string& path, c10::Device device) {
  if (!std::filesystem::exists(path)) {
    throw CheckpointError(fmt::format("{}: missing random generator state of this rank (was the checkpoint made "
                                      "with as many ranks?)",
                                      path));
  }
  auto file = checkpoint::SafetensorsFile::open(path);
  if (!file.contains("cpu")) throw CheckpointError(fmt::format("{}: no 'cpu' generator state", path));
  set_generator_state(at::detail::getDefaultCPUGenerator(), file.get("cpu"));
  // A CPU-saved state resumed on a GPU leaves the GPU generator as seeded.
  if (device.is_cuda() && file.contains("cuda")) {
    set_generator_state(at::globalContext().defaultGenerator(device), file.get("cuda"));
  }
}

}  // namespace colossus::apps
