// `train.task = "sft"` end to end on 1 and 2 MPI ranks: 10 steps on JSONL
// prompt/completion records give TRL's SFTTrainer losses step for step (fp32,
// the same model, data order and hyperparameters; global batch 4 as 4 x 1
// rank or 2 x 2 ranks), padded or packed, under ddp, zero1, zero2, gemini and tp2;
// a run saved at step 3 and resumed
// continues the uninterrupted curve exactly; conversations trained on their
// assistant turns give TRL's assistant_only_loss curve; SFT- and DPO-only
// keys are refused by name.
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"
#include "colossus/core/errors.h"
#include "tests/apps/oracle_runs.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

using namespace colossus;
namespace ct = colossus::testing;
namespace fs = std::filesystem;

namespace {

// The oracle's outputs, made once per job by rank 0.
const fs::path& oracle_dir() {
  static const fs::path dir =
      ct::run_oracle_once("sft_train_test", "trl", COLOSSUS_PYTHON, COLOSSUS_SFT_TRL_ORACLE, "trl_chat_losses.json");
  return dir;
}

fs::path job_dir(const std::string& name) { return ct::fresh_job_dir("sft_train_test", name); }

// TRL's settings (sft_trl_oracle.py): global batch 4, AdamW(0.9, 0.999, 1e-8),
// lr 1e-3 constant, no weight decay, no clipping, max_length 64.
apps::TrainConfig sft_config(const fs::path& output_dir, const std::vector<std::string>& extra = {}) {
  const int64_t per_rank = 4 / ct::world()->size();
  std::vector<std::string> overrides{"train.task=\"sft\"",
                                     "train.output_dir=\"" + output_dir.string() + "\"",
                                     "train.steps=10",
                                     "train.log_every=1",
                                     "train.tensorboard=false",
                                     "train.sample_tokens=0",
                                     "model.pretrained=\"" + (oracle_dir() / "model").string() + "\"",
                                     "data.source=\"" + (oracle_dir() / "data.jsonl").string() + "\"",
                                     "data.shuffle=false",
                                     "data.seq_len=64",
                                     fmt::format("data.batch_size={}", per_rank),
                                     "optimizer.name=\"adamw\"",
                                     "optimizer.lr=1e-3",
                                     "optimizer.beta2=0.999",
                                     "optimizer.weight_decay=0.0",
                                     "lr_scheduler.name=\"constant\""};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return apps::parse_train_config("", overrides);
}

std::vector<double> losses_of(const apps::TrainResult& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

std::vector<double> trl_losses(const std::string& file) {
  std::ifstream in(oracle_dir() / file);
  return nlohmann::json::parse(in).get<std::vector<double>>();
}

void expect_trl_curve(const std::vector<double>& ours, const std::string& what,
                      const std::string& trl_file = "trl_losses.json") {
  const auto trl = trl_losses(trl_file);
  ASSERT_EQ(ours.size(), trl.size()) << what;
  double worst = 0.0;
  for (size_t i = 0; i < trl.size(); ++i) worst = std::max(worst, std::abs(ours[i] - trl[i]) / std::abs(trl[i]));
  EXPECT_LE(worst, 1e-5) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s on %d rank(s): loss %.6f -> %.6f, max rel diff vs TRL %.2e\n", what.c_str(), ct::world()->size(),
                ours.front(), ours.back(), worst);
  }
}

}  // namespace

TEST(SftTrain, PaddedBatchesTrainTrlsCurve) {
  expect_trl_curve(losses_of(apps::train(sft_config(job_dir("padded")))), "sft padded");
  // Ulysses over 2 ranks: rows of any length (padded to the 2 shards, the
  // padding seen by no token) under their attention mask.
  if (ct::world()->size() == 2) {
    expect_trl_curve(losses_of(apps::train(sft_config(
                         job_dir("padded_sp2"),
                         {"plugin.name=\"hybrid_parallel\"", "plugin.sp_size=2", "data.batch_size=4",
                          "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"all_to_all\""}))),
                     "sft padded sp2 all_to_all");
    // Ring attention: each ring block masked by the rows' document ids.
    expect_trl_curve(losses_of(apps::train(sft_config(
                         job_dir("padded_sp2_ring_attn"),
                         {"plugin.name=\"hybrid_parallel\"", "plugin.sp_size=2", "data.batch_size=4",
                          "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"ring_attn\""}))),
                     "sft padded sp2 ring_attn");
  }
}

// Packed rows hold the same examples per step (4 short examples fit one row
// of 64 tokens or two): the per-token mean, hence the curve, is the same.
TEST(SftTrain, PackedBatchesTrainTrlsCurve) {
  expect_trl_curve(losses_of(apps::train(sft_config(job_dir("packed"), {"data.packing=true"}))), "sft packed");
}

// The plugins take the packed layout through forward_loss: ZeRO-2 and Gemini
// (fp32) over the ranks, and tensor parallelism over 2 ranks (one dp rank
// holding the whole global batch), plain and with the sequence sharded over
// the tp group (split_gather, ring), all on TRL's curve.
TEST(SftTrain, ZeroGeminiAndTensorParallelTrainTrlsCurve) {
  std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"zero1", {"plugin.name=\"low_level_zero\"", "plugin.stage=1", "plugin.precision=\"fp32\""}},
      {"zero2", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"fp32\""}},
      {"gemini", {"plugin.name=\"gemini\"", "plugin.precision=\"fp32\""}}};
  if (ct::world()->size() == 2) {
    cases.push_back({"tp2", {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2", "data.batch_size=4"}});
    cases.push_back({"tp2_split_gather",
                     {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2", "data.batch_size=4",
                      "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"split_gather\""}});
    cases.push_back({"tp2_ring",
                     {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2", "data.batch_size=4",
                      "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"ring\""}});
    cases.push_back({"sp2_all_to_all",
                     {"plugin.name=\"hybrid_parallel\"", "plugin.sp_size=2", "data.batch_size=4",
                      "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"all_to_all\""}});
    cases.push_back({"sp2_ring_attn",
                     {"plugin.name=\"hybrid_parallel\"", "plugin.sp_size=2", "data.batch_size=4",
                      "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"ring_attn\""}});
  }
  for (auto& [name, keys] : cases) {
    keys.push_back("data.packing=true");
    expect_trl_curve(losses_of(apps::train(sft_config(job_dir(name), keys))), "sft packed " + name);
  }
}

// Pipeline parallelism over 2 ranks (2 stages, one dp rank with the global
// batch): padded rows in 2 microbatches of 2, and the same batch as 2
// accumulated loader batches of 2 packed rows (one pipeline batch whose
// microbatches they are, padded to a common length); both on TRL's curve.
TEST(SftTrain, PipelineParallelTrainsTrlsCurve) {
  if (ct::world()->size() != 2) GTEST_SKIP() << "pp = 2 needs 2 ranks";
  const std::vector<std::string> pp{"plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2"};
  auto padded = pp;
  padded.insert(padded.end(), {"data.batch_size=4", "plugin.num_microbatches=2"});
  expect_trl_curve(losses_of(apps::train(sft_config(job_dir("pp2_padded"), padded))), "sft padded pp2");
  auto packed = pp;
  packed.insert(packed.end(), {"data.batch_size=2", "train.grad_accum=2", "data.packing=true"});
  expect_trl_curve(losses_of(apps::train(sft_config(job_dir("pp2_packed"), packed))), "sft packed pp2 accum 2");
}

// Conversations through the model's chat template (ChatML with its assistant
// turns in {% generation %} blocks), trained on the assistant turns only:
// TRL's assistant_only_loss curve, padded and packed.
TEST(SftTrain, ChatAssistantTurnsTrainTrlsCurve) {
  for (const bool packing : {false, true}) {
    const std::string name = packing ? "chat_packed" : "chat_padded";
    const auto config = sft_config(job_dir(name), {"data.source=\"" + (oracle_dir() / "chat.jsonl").string() + "\"",
                                                   "data.train_on=\"assistant\"",
                                                   fmt::format("data.packing={}", packing)});
    expect_trl_curve(losses_of(apps::train(config)), "sft " + name, "trl_chat_losses.json");
  }
}

TEST(SftTrain, ResumeContinuesTheExactCurve) {
  const auto whole = losses_of(apps::train(sft_config(job_dir("whole"), {"data.packing=true", "train.steps=6"})));
  const auto dir = job_dir("resumed");
  apps::train(sft_config(dir, {"data.packing=true", "train.steps=3"}));
  const auto rest = apps::train(sft_config(dir, {"data.packing=true", "train.steps=6"}), {.resume = "auto"});
  EXPECT_EQ(rest.first_step, 3);
  const auto tail = losses_of(rest);
  ASSERT_EQ(tail.size(), 3U);
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(tail[i], whole[i + 3]) << "step " << i + 4;
}

// data.shuffle: a seeded permutation of the records each epoch (40 records,
// 10 steps an epoch): another curve than file order, and a run resumed at
// step 7 continues the uninterrupted one across the epoch boundary.
TEST(SftTrain, ShuffledRecordsResumeExactly) {
  const std::vector<std::string> keys = {"data.packing=true", "data.shuffle=true", "train.steps=12"};
  const auto whole = losses_of(apps::train(sft_config(job_dir("shuffled"), keys)));
  const auto in_order = losses_of(apps::train(sft_config(job_dir("in_order"), {"data.packing=true", "train.steps=12"})));
  EXPECT_NE(whole, in_order);
  const auto dir = job_dir("shuffled_resumed");
  auto first = keys;
  first.back() = "train.steps=7";
  apps::train(sft_config(dir, first));
  const auto rest = losses_of(apps::train(sft_config(dir, keys), {.resume = "auto"}));
  ASSERT_EQ(rest.size(), 5U);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_DOUBLE_EQ(rest[i], whole[i + 7]) << "step " << i + 8;
}

TEST(SftTrain, SftKeysAreCheckedByName) {
  auto message = [](const std::vector<std::string>& extra) {
    try {
      sft_config("/tmp/unused", extra).validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({"data.max_length=65"}).find("data.max_length = 65"), std::string::npos);
  EXPECT_NE(message({"data.format=\"chats\""}).find("chats"), std::string::npos);
  EXPECT_NE(message({"data.train_on=\"prompt\""}).find("valid: auto, assistant, completion, all"), std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "dpo.beta=0"}).find("dpo.beta = 0"), std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "dpo.loss_type=\"kto\""}).find("valid: sigmoid, ipo, hinge, robust"),
            std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "dpo.label_smoothing=0.1"}).find("robust"), std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "data.packing=true", "plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2",
                     "plugin.parallel_output=false"})
                .find("data.packing"),
            std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "data.format=\"chat\""}).find("preference"), std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2"})
                .find("parallel_output = false"),
            std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2",
                     "plugin.parallel_output=false", "plugin.microbatch_size=3"})
                .find("would split a chosen/rejected pair"),
            std::string::npos);
  EXPECT_NE(message({"plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2", "plugin.tp_size=2",
                     "plugin.enable_sequence_parallelism=true", "plugin.sequence_parallelism_mode=\"split_gather\""})
                .find("pipeline and sequence parallelism"),
            std::string::npos);
  EXPECT_NE(message({"train.task=\"rlhf\""}).find("valid: pretrain, sft, dpo"), std::string::npos);
  EXPECT_NE(message({"data.source=\"builtin\""}).find("reads JSONL records"), std::string::npos);
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
