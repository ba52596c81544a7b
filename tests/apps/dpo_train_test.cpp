// `train.task = "dpo"` end to end on 1 and 2 MPI ranks: 10 steps on JSONL
// preference pairs give TRL's DPOTrainer losses and reward metrics step for
// step (fp32, the same model as policy and frozen reference, data order and
// hyperparameters; global batch 4 pairs as 4 x 1 rank or 2 x 2 ranks), for
// plain-string and conversational pairs, under ddp, zero1, zero2, gemini and
// tp2 (logits gathered); with
// LoRA, the adapter as it started as the reference.
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"
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
#include <vector>

using namespace colossus;
namespace ct = colossus::testing;
namespace fs = std::filesystem;

namespace {

// The oracle's outputs, made once per job by rank 0.
const fs::path& oracle_dir() {
  static const fs::path dir =
      ct::run_oracle_once("dpo_train_test", "trl", COLOSSUS_PYTHON, COLOSSUS_DPO_TRL_ORACLE, "lora_pairs.trl.json");
  return dir;
}

fs::path job_dir(const std::string& name) { return ct::fresh_job_dir("dpo_train_test", name); }

// TRL's settings (dpo_trl_oracle.py): 4 pairs a step, beta 0.1, sigmoid,
// AdamW(0.9, 0.999, 1e-8), lr 1e-3 constant, no weight decay, no clipping,
// max_length 64.
apps::TrainConfig dpo_config(const fs::path& output_dir, const std::string& pairs,
                             const std::vector<std::string>& extra = {}) {
  const int64_t per_rank = 4 / ct::world()->size();
  std::vector<std::string> overrides{"train.task=\"dpo\"",
                                     "train.output_dir=\"" + output_dir.string() + "\"",
                                     "train.steps=10",
                                     "train.log_every=1",
                                     "train.tensorboard=false",
                                     "train.sample_tokens=0",
                                     "model.pretrained=\"" + (oracle_dir() / "model").string() + "\"",
                                     "data.source=\"" + (oracle_dir() / (pairs + ".jsonl")).string() + "\"",
                                     "data.shuffle=false",
                                     "data.seq_len=64",
                                     fmt::format("data.batch_size={}", per_rank),
                                     "optimizer.name=\"adamw\"",
                                     "optimizer.lr=1e-3",
                                     "optimizer.beta2=0.999",
                                     "optimizer.weight_decay=0.0",
                                     "lr_scheduler.name=\"constant\"",
                                     "dpo.beta=0.1"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return apps::parse_train_config("", overrides);
}

// Rewards start at 0 (policy = reference), where a relative difference means
// nothing: below 1e-2 the difference is taken against 1e-2.
double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-2); }

void expect_trl_steps(const apps::TrainResult& result, const std::string& pairs, const std::string& what) {
  std::ifstream in(oracle_dir() / (pairs + ".trl.json"));
  const auto trl = nlohmann::json::parse(in);
  ASSERT_EQ(result.steps.size(), trl.size()) << what;
  double worst_loss = 0.0, worst_reward = 0.0;
  for (size_t i = 0; i < trl.size(); ++i) {
    const auto& ours = result.steps[i];
    const auto& want = trl[i];
    worst_loss = std::max(worst_loss, rel(ours.loss, want["loss"].get<double>()));
    worst_reward = std::max({worst_reward, rel(ours.metrics.at("rewards/chosen"), want["rewards_chosen"].get<double>()),
                             rel(ours.metrics.at("rewards/rejected"), want["rewards_rejected"].get<double>()),
                             rel(ours.metrics.at("rewards/margins"), want["rewards_margin"].get<double>())});
    // Where TRL's policy equals its reference (step 1: every margin exactly
    // 0) each pair is a tie that rounding decides (our reference is its own
    // model, run without a graph); elsewhere the accuracy must match.
    if (want["rewards_margin"].get<double>() == 0.0) {
      EXPECT_LE(std::abs(ours.metrics.at("rewards/margins")), 1e-5) << what << " step " << i + 1;
    } else {
      EXPECT_DOUBLE_EQ(ours.metrics.at("rewards/accuracies"), want["rewards_accuracy"].get<double>())
          << what << " step " << i + 1;
    }
  }
  EXPECT_LE(worst_loss, 1e-5) << what;
  // The tp2 policy and the plain reference round differently: a reward of
  // ~5e-7 at step 1, where TRL's is 0.
  EXPECT_LE(worst_reward, 1e-4) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s on %d rank(s): loss %.6f -> %.6f, margin -> %.4f; max rel diff vs TRL: loss %.2e, rewards %.2e\n",
                what.c_str(), ct::world()->size(), result.steps.front().loss, result.steps.back().loss,
                result.steps.back().metrics.at("rewards/margins"), worst_loss, worst_reward);
  }
}

}  // namespace

TEST(DpoTrain, PlainPairsTrainTrlsCurve) {
  expect_trl_steps(apps::train(dpo_config(job_dir("pairs"), "pairs")), "pairs", "dpo pairs");
}

// Chosen and rejected sequences packed several to a 64-token row (positions
// restarting, attention kept inside each), log-probs summed per sequence:
// the same curve, padded or packed, plain and under ZeRO-2.
TEST(DpoTrain, PackedPairsTrainTrlsCurve) {
  expect_trl_steps(apps::train(dpo_config(job_dir("packed"), "pairs", {"data.packing=true"})), "pairs", "dpo packed");
  expect_trl_steps(apps::train(dpo_config(job_dir("packed_zero2"), "pairs",
                                           {"data.packing=true", "plugin.name=\"low_level_zero\"", "plugin.stage=2",
                                            "plugin.precision=\"fp32\""})),
                   "pairs", "dpo packed zero2");
}

// Conversational pairs: prompt rendered with the generation prompt, each
// completion where prompt + completion parts from it (the model's template).
TEST(DpoTrain, ChatPairsTrainTrlsCurve) {
  expect_trl_steps(apps::train(dpo_config(job_dir("chat_pairs"), "chat_pairs")), "chat_pairs", "dpo chat pairs");
}

// LoRA: the policy continues a PEFT adapter and the reference is the policy
// as it started (the adapter's snapshot, no second model), as TRL with a
// PeftModel keeps a "ref" copy of the adapter.
TEST(DpoTrain, LoraAdapterWithItsStartAsReferenceTrainsTrlsCurve) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"ddp", {}},
      {"zero2", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"fp32\""}}};
  for (auto [name, keys] : cases) {
    keys.push_back("lora.adapter=\"" + (oracle_dir() / "adapter").string() + "\"");
    expect_trl_steps(apps::train(dpo_config(job_dir("lora_" + name), "pairs", keys)), "lora_pairs", "dpo lora " + name);
  }
}

TEST(DpoTrain, ZeroGeminiAndTensorParallelTrainTrlsCurve) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"zero1", {"plugin.name=\"low_level_zero\"", "plugin.stage=1", "plugin.precision=\"fp32\""}},
      {"zero2", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"fp32\""}},
      {"gemini", {"plugin.name=\"gemini\"", "plugin.precision=\"fp32\""}}};
  for (const auto& [name, keys] : cases) {
    expect_trl_steps(apps::train(dpo_config(job_dir(name), "pairs", keys)), "pairs", "dpo " + name);
  }
  // Tensor parallelism over 2 ranks (one dp rank holding the 4 pairs), the logits gathered.
  if (ct::world()->size() == 2) {
    expect_trl_steps(apps::train(dpo_config(job_dir("tp2"), "pairs",
                                             {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2",
                                              "plugin.parallel_output=false", "data.batch_size=4"})),
                     "pairs", "dpo tp2");
    // The sequence sharded over the tp group, gathered back before the head.
    expect_trl_steps(apps::train(dpo_config(job_dir("tp2_split_gather"), "pairs",
                                             {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2",
                                              "plugin.parallel_output=false", "data.batch_size=4",
                                              "plugin.enable_sequence_parallelism=true",
                                              "plugin.sequence_parallelism_mode=\"split_gather\""})),
                     "pairs", "dpo tp2 split_gather");
    // Ulysses on an sp axis: the logits stay sequence-sharded and each
    // sequence's log-prob is summed over the sp group; padded and packed.
    const std::vector<std::string> sp2{"plugin.name=\"hybrid_parallel\"", "plugin.sp_size=2",
                                       "plugin.parallel_output=false", "data.batch_size=4",
                                       "plugin.enable_sequence_parallelism=true",
                                       "plugin.sequence_parallelism_mode=\"all_to_all\""};
    expect_trl_steps(apps::train(dpo_config(job_dir("sp2_all_to_all"), "pairs", sp2)), "pairs",
                     "dpo sp2 all_to_all");
    auto packed = sp2;
    packed.push_back("data.packing=true");
    expect_trl_steps(apps::train(dpo_config(job_dir("sp2_all_to_all_packed"), "pairs", packed)), "pairs",
                     "dpo sp2 all_to_all packed");
    // Ring attention: zig-zag shards, each ring block masked by document.
    auto ring = packed;
    ring[5] = "plugin.sequence_parallelism_mode=\"ring_attn\"";
    expect_trl_steps(apps::train(dpo_config(job_dir("sp2_ring_attn_packed"), "pairs", ring)), "pairs",
                     "dpo sp2 ring_attn packed");
  }
}

// Pipeline parallelism over 2 ranks: the step's pairs as one pipeline batch
// (rows chosen, rejected, ...) in microbatches of whole pairs, the reference
// log-probs handed to each microbatch's criterion: 2 microbatches of 2 pairs,
// and 2 accumulated loader batches of 2 pairs.
TEST(DpoTrain, PipelineParallelTrainsTrlsCurve) {
  if (ct::world()->size() != 2) GTEST_SKIP() << "pp = 2 needs 2 ranks";
  const std::vector<std::string> pp{"plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2",
                                    "plugin.parallel_output=false"};
  auto two_microbatches = pp;
  two_microbatches.insert(two_microbatches.end(), {"data.batch_size=4", "plugin.microbatch_size=4"});
  expect_trl_steps(apps::train(dpo_config(job_dir("pp2"), "pairs", two_microbatches)), "pairs", "dpo pp2");
  auto accumulated = pp;
  accumulated.insert(accumulated.end(), {"data.batch_size=2", "train.grad_accum=2"});
  expect_trl_steps(apps::train(dpo_config(job_dir("pp2_accum"), "pairs", accumulated)), "pairs", "dpo pp2 accum 2");
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
