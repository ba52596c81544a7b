// What a checkpoint needs beyond the model, optimizer and scheduler for a
// resumed run to continue the exact loss curve: the step, how far the data
// loader got, the data layout it was made with, and each rank's random
// generator states (dropout). Written as train_state.json plus one small
// safetensors file of generator states per rank.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace colossus::apps {

struct TrainState {
  int64_t step = 0;             // optimizer steps done
  int64_t tokens_seen = 0;      // over all ranks
  int64_t data_epoch = 0;       // the data loader's position after `step`
  int64_t data_position = 0;
  // The layout the position refers to; resuming under another one would read
  // other batches, so it is refused with both layouts named.
  int64_t dp_size = 1;
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  int64_t seq_len = 0;
  double last_loss = 0.0;
  // train.task = "sft": where the example stream resumes (SftStreamPosition
  // as JSON text; the same on every rank); empty for pretraining, whose
  // tokens_seen follows from the step and whose position is data_epoch/data_position.
  std::string sft_position;

  void save(const std::string& path) const;  // atomic
  // Throws CheckpointError naming the file for a missing file or field, or a
  // field out of range (validate()).
  static TrainState load(const std::string& path);
  // Every count >= 0 (sizes >= 1), last_loss finite, tokens_seen equal to
  // step x the global batch's tokens; CheckpointError naming `path` and the field.
  void validate(const std::string& path) const;
};

// The CPU generator's state (and `device`'s, when it is a GPU)
// into `path` / back. Each rank has its own file: dropout masks differ by rank.
void save_rng_state(const std::string& path, c10::Device device);
void load_rng_state(const std::string& path, c10::Device device);

}  // namespace colossus::apps
