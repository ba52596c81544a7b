// `[lora]` in `colossus train` on 1 and 2 MPI ranks: continuing a PEFT
// adapter (lora.adapter) on SFT records gives TRL's SFTTrainer losses on the
// same PeftModel step for step (fp32, base frozen), under ddp, zero2 and
// gemini, and tensor parallelism (tp2); each checkpoint holds the adapters in PEFT's format in adapter/
// beside model/, equal to the trained weights of model/ and loadable as a
// PEFT adapter; the base weights stay those of the pretrained model.
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/inject.h"
#include "colossus/lora/merged_model.h"
#include "colossus/lora/peft_io.h"
#include "colossus/models/pretrained.h"
#include "tests/apps/oracle_runs.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
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
      ct::run_oracle_once("lora_train_test", "trl", COLOSSUS_PYTHON, COLOSSUS_LORA_TRL_ORACLE, "trl_losses.json");
  return dir;
}

fs::path job_dir(const std::string& name) { return ct::fresh_job_dir("lora_train_test", name); }

apps::TrainConfig lora_config(const fs::path& output_dir, const std::vector<std::string>& extra = {},
                              const std::string& model = "model", const std::string& adapter = "adapter") {
  const int64_t per_rank = 4 / ct::world()->size();
  std::vector<std::string> overrides{"train.task=\"sft\"",
                                     "train.output_dir=\"" + output_dir.string() + "\"",
                                     "train.steps=10",
                                     "train.log_every=1",
                                     "train.tensorboard=false",
                                     "train.sample_tokens=0",
                                     "model.pretrained=\"" + (oracle_dir() / model).string() + "\"",
                                     "data.source=\"" + (oracle_dir() / "data.jsonl").string() + "\"",
                                     "data.shuffle=false",
                                     "data.seq_len=64",
                                     fmt::format("data.batch_size={}", per_rank),
                                     "optimizer.name=\"adamw\"",
                                     "optimizer.lr=1e-3",
                                     "optimizer.beta2=0.999",
                                     "optimizer.weight_decay=0.0",
                                     "lr_scheduler.name=\"constant\"",
                                     "lora.adapter=\"" + (oracle_dir() / adapter).string() + "\""};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return apps::parse_train_config("", overrides);
}

void expect_trl_curve(const apps::TrainResult& result, const std::string& what,
                      const std::string& trl_file = "trl_losses.json") {
  std::ifstream in(oracle_dir() / trl_file);
  const auto trl = nlohmann::json::parse(in).get<std::vector<double>>();
  ASSERT_EQ(result.steps.size(), trl.size()) << what;
  double worst = 0.0;
  for (size_t i = 0; i < trl.size(); ++i) worst = std::max(worst, std::abs(result.steps[i].loss - trl[i]) / trl[i]);
  EXPECT_LE(worst, 1e-5) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s on %d rank(s): loss %.6f -> %.6f, max rel diff vs TRL + PEFT %.2e\n", what.c_str(),
                ct::world()->size(), result.steps.front().loss, result.steps.back().loss, worst);
  }
}

// The final checkpoint: adapter/ is a PEFT adapter whose weights are model/'s
// adapter tensors, and model/'s base tensors are the pretrained ones.
void expect_adapter_checkpoint(const apps::TrainResult& result, const std::string& what) {
  if (ct::world()->rank() != 0) return;
  ASSERT_FALSE(result.final_checkpoint.empty()) << what;
  const fs::path step = result.final_checkpoint;
  ASSERT_TRUE(fs::exists(step / "adapter" / "adapter_config.json")) << what;
  auto model = models::load_pretrained((oracle_dir() / "model").string());
  const auto config = lora::load_peft_adapter(*model, (step / "adapter").string());
  EXPECT_EQ(config.r, 8) << what;
  const auto saved = checkpoint::load_state_dict((step / "model").string());
  const auto original = checkpoint::load_state_dict((oracle_dir() / "model").string());
  int adapters = 0, bases = 0;
  for (const auto& item : model->named_parameters()) {
    const auto it = saved.find(item.key());
    ASSERT_NE(it, saved.end()) << what << ": " << item.key() << " not in model/";
    if (item.key().find(".lora_") != std::string::npos) {
      EXPECT_TRUE(at::equal(item.value(), it->second.to(item.value().scalar_type()))) << what << ": " << item.key();
      ++adapters;
    } else if (const auto base = original.find(item.key()); base != original.end()) {
      EXPECT_TRUE(at::equal(base->second, it->second)) << what << ": base " << item.key() << " changed";
      ++bases;
    }
  }
  EXPECT_EQ(adapters, 2 * 14) << what;  // A and B of 7 linear layers x 2 blocks
  EXPECT_GT(bases, 0) << what;
}

}  // namespace

TEST(LoraTrain, PeftAdapterTrainsTrlsCurve) {
  const auto result = apps::train(lora_config(job_dir("ddp")));
  expect_trl_curve(result, "lora ddp");
  expect_adapter_checkpoint(result, "lora ddp");
}

TEST(LoraTrain, ZeroAndGeminiTrainTrlsCurve) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"zero1", {"plugin.name=\"low_level_zero\"", "plugin.stage=1", "plugin.precision=\"fp32\""}},
      {"zero2", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"fp32\""}},
      {"gemini", {"plugin.name=\"gemini\"", "plugin.precision=\"fp32\""}}};
  for (const auto& [name, keys] : cases) {
    const auto result = apps::train(lora_config(job_dir(name), keys));
    expect_trl_curve(result, "lora " + name);
    expect_adapter_checkpoint(result, "lora " + name);
  }
}

// Tensor parallelism: each adapter split as its base (lora_B's rows over a
// column-parallel layer, lora_A's columns over a row-parallel one); the
// checkpoint gathers them back to PEFT's shapes.
TEST(LoraTrain, TensorParallelTrainsTrlsCurve) {
  if (ct::world()->size() != 2) GTEST_SKIP() << "tp = 2 needs 2 ranks";
  const auto result = apps::train(lora_config(
      job_dir("tp2"),
      {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2", "plugin.precision=\"fp32\"", "data.batch_size=4"}));
  expect_trl_curve(result, "lora tp2");
  expect_adapter_checkpoint(result, "lora tp2");
  // Sequence parallelism on an sp axis (Ulysses): the adapters see whole
  // tokens, their gradients averaged over dp x sp like any replicated weight.
  const auto sp = apps::train(lora_config(
      job_dir("sp2"), {"plugin.name=\"hybrid_parallel\"", "plugin.sp_size=2", "plugin.precision=\"fp32\"",
                       "data.batch_size=4", "plugin.enable_sequence_parallelism=true",
                       "plugin.sequence_parallelism_mode=\"all_to_all\""}));
  expect_trl_curve(sp, "lora sp2 all_to_all");
  expect_adapter_checkpoint(sp, "lora sp2 all_to_all");
  // The sequence sharded over the tp group (split_gather, ring): the
  // adapters gather / reduce-scatter their r-wide products along the
  // sequence as their bases do.
  for (const std::string mode : {"split_gather", "ring"}) {
    const auto seq = apps::train(lora_config(
        job_dir("tp2_" + mode), {"plugin.name=\"hybrid_parallel\"", "plugin.tp_size=2", "plugin.precision=\"fp32\"",
                                 "data.batch_size=4", "plugin.enable_sequence_parallelism=true",
                                 "plugin.sequence_parallelism_mode=\"" + mode + "\""}));
    expect_trl_curve(seq, "lora tp2 " + mode);
    expect_adapter_checkpoint(seq, "lora tp2 " + mode);
  }
  // Pipeline parallelism: 2 stages, 2 microbatches of 2 rows; the frozen
  // base gets no gradient on either stage.
  const auto pp = apps::train(lora_config(job_dir("pp2"), {"plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2",
                                                           "plugin.precision=\"fp32\"", "data.batch_size=4",
                                                           "plugin.num_microbatches=2"}));
  expect_trl_curve(pp, "lora pp2");
  expect_adapter_checkpoint(pp, "lora pp2");
  // Zero-bubble's split backward computes weight gradients for the adapters only.
  const auto zb = apps::train(lora_config(job_dir("pp2_zb"), {"plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2",
                                                              "plugin.precision=\"fp32\"", "data.batch_size=4",
                                                              "plugin.num_microbatches=2",
                                                              "plugin.pp_style=\"zero_bubble\""}));
  expect_trl_curve(zb, "lora pp2 zero_bubble");
}

// An adapter that also trains biases (PEFT's bias "all") and the LM head
// whole (modules_to_save): TRL + PEFT's curve; the checkpoint's adapter/
// holds them under PEFT's keys ("<path>.base_layer.bias" for an adapted
// layer's bias, "lm_head.weight") and loads back onto the base. PEFT's
// bias "lora_only" adapter loads with only the adapted layers' biases
// trainable.
TEST(LoraTrain, BiasesAndSavedModulesTrainTrlsCurve) {
  const auto result = apps::train(lora_config(job_dir("extras"), {}, "model_bias", "adapter_extras"));
  expect_trl_curve(result, "lora bias all + modules_to_save lm_head", "trl_losses_extras.json");
  if (ct::world()->rank() != 0) return;
  ASSERT_FALSE(result.final_checkpoint.empty());
  const fs::path adapter = fs::path(result.final_checkpoint) / "adapter";
  const auto saved = checkpoint::load_state_dict((adapter / "adapter_model.safetensors").string());
  for (const char* key : {"base_model.model.lm_head.weight", "base_model.model.model.layers.0.self_attn.k_proj.bias",
                          "base_model.model.model.layers.1.self_attn.q_proj.base_layer.bias"}) {
    EXPECT_TRUE(saved.contains(key)) << key;
  }
  auto model = models::load_pretrained((oracle_dir() / "model_bias").string());
  const auto config = lora::load_peft_adapter(*model, adapter.string());
  EXPECT_EQ(config.bias, "all");
  EXPECT_EQ(config.modules_to_save, std::vector<std::string>{"lm_head"});
  const auto trained = checkpoint::load_state_dict((fs::path(result.final_checkpoint) / "model").string());
  for (const auto& item : model->named_parameters()) {
    if (item.key() == "lm_head.weight" || item.key().ends_with(".bias")) {
      EXPECT_TRUE(item.value().requires_grad()) << item.key();
      EXPECT_TRUE(at::equal(item.value(), trained.at(item.key()))) << item.key() << " is the trained one";
    }
  }

  auto lora_only = models::load_pretrained((oracle_dir() / "model_bias").string());
  lora::load_peft_adapter(*lora_only, (oracle_dir() / "adapter_lora_only").string());
  for (const auto& item : lora_only->named_parameters()) {
    const bool adapted_bias = item.key().ends_with("q_proj.bias") || item.key().ends_with("v_proj.bias");
    const bool adapter = item.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(item.value().requires_grad(), adapted_bias || adapter) << item.key();
  }
}

// QLoRA: the base's linear layers in NF4 (double-quantised, as
// bitsandbytes), continuing a PEFT adapter: TRL's SFTTrainer on the same
// adapter over transformers' 4-bit (bitsandbytes) base gives the same curve
// (to the double quantisation's near-tie rounding).
// The checkpoint holds no base linear weights; its adapter goes back onto
// the base model it names.
TEST(LoraTrain, QloraTrainsTrlsCurve) {
  static const fs::path qlora = ct::run_oracle_once("lora_train_test", "qlora_oracle", COLOSSUS_PYTHON,
                                                     COLOSSUS_QLORA_TRL_ORACLE, "trl_losses.json",
                                                     "TORCHDYNAMO_DISABLE=1");
  auto config = lora_config(job_dir("qlora"), {"model.pretrained=\"" + (qlora / "model").string() + "\"",
                                               "data.source=\"" + (qlora / "data.jsonl").string() + "\"",
                                               "lora.adapter=\"" + (qlora / "adapter").string() + "\"",
                                               "lora.quantize=\"nf4\""});
  const auto result = apps::train(config);
  std::ifstream in(qlora / "trl_losses.json");
  const auto trl = nlohmann::json::parse(in).get<std::vector<double>>();
  ASSERT_EQ(result.steps.size(), trl.size());
  double worst = 0.0;
  for (size_t i = 0; i < trl.size(); ++i) worst = std::max(worst, std::abs(result.steps[i].loss - trl[i]) / trl[i]);
  // Not 1e-5: bitsandbytes' CPU kernel rounds a few near-tie double-quantised
  // absmax codes to the other neighbour (nf4_test), so a few blocks' scales
  // differ by a fraction of a percent (measured 5e-4 on the losses).
  EXPECT_LE(worst, 2e-3);
  if (ct::world()->rank() != 0) return;
  std::printf("qlora on %d rank(s): loss %.6f -> %.6f, max rel diff vs TRL + PEFT + bitsandbytes %.2e\n",
              ct::world()->size(), result.steps.front().loss, result.steps.back().loss, worst);
  const fs::path step = result.final_checkpoint;
  const auto saved = checkpoint::load_state_dict((step / "model").string());
  EXPECT_FALSE(saved.contains("model.layers.0.self_attn.q_proj.weight")) << "NF4 base weights are not saved";
  EXPECT_TRUE(saved.contains("model.layers.0.self_attn.q_proj.lora_A.weight"));
  auto merged = lora::load_merged((step / "model").string(), (step / "adapter").string());
  EXPECT_TRUE(lora::lora_layers(*merged).empty());
}

TEST(LoraTrain, LoraKeysAreCheckedByName) {
  auto message = [](const std::vector<std::string>& extra) {
    try {
      lora_config("/tmp/unused", extra).validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({"lora.r=8"}).find("leave lora.r at 0"), std::string::npos);
  EXPECT_NE(message({"lora.adapter=\"\"", "lora.r=-1"}).find("lora.r = -1"), std::string::npos);
  EXPECT_NE(message({"lora.adapter=\"\"", "lora.r=8", "lora.lora_dropout=1.0"}).find("dropout"), std::string::npos);
  EXPECT_NE(message({"train.task=\"dpo\"", "plugin.name=\"hybrid_parallel\"", "plugin.pp_size=2",
                     "plugin.parallel_output=false"})
                .find("pipeline"),
            std::string::npos);
  EXPECT_NE(message({"plugin.name=\"gemini\"", "plugin.lazy_init=true"}).find("lazy_init"), std::string::npos);
  EXPECT_NE(message({"lora.quantize=\"int8\""}).find("valid: \"nf4\""), std::string::npos);
  EXPECT_NE(message({"lora.adapter=\"\"", "lora.quantize=\"nf4\""}).find("set lora.r"), std::string::npos);
  const auto split = apps::lora_config(apps::LoraSection{.r = 4, .target_modules = " q_proj, v_proj "});
  EXPECT_EQ(split.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
