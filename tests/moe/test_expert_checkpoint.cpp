// Checkpoints of an expert-parallel Mixtral: saved with ep = world size, the
// directory loads as one process and with another ep (same logits), and into
// transformers (mixtral_oracle.py check: clean load, same logits and aux loss).
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/pretrained.h"
#include "colossus/moe/expert_checkpoint.h"
#include "colossus/moe/shard_experts.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

namespace colossus::moe {
namespace {

namespace ct = colossus::testing;
namespace fs = std::filesystem;

TEST(ExpertCheckpoint, SavedWithEpLoadsWithAnyEpAndIntoTransformers) {
  auto world = ct::world();
  const int64_t w = world->size();
  auto config = std::get<models::MixtralConfig>(models::preset("mixtral-tiny"));
  config.initializer_range = 0.2;
  config.num_local_experts = 4;
  // One directory for all ranks, made by rank 0 with mkdtemp.
  const fs::path dir = colossus::testing::job_scratch_dir("moe_ckpt");

  auto ep_group = world->split(0, world->rank(), "ckpt_ep");  // ep = world size
  auto base = models::create_model(config, {.seed = 9});
  auto& model = dynamic_cast<models::MixtralForCausalLM&>(*base);
  shard_experts(model, ep_group);
  model.eval();
  at::Tensor ids = at::randint(config.vocab_size, {2, 16}, at::make_generator<at::CPUGeneratorImpl>(4), at::kLong);
  at::Tensor logits, aux;
  {
    at::NoGradGuard no_grad;
    logits = model.forward(ids);
    aux = model.aux_loss().reshape({1});
  }
  save_expert_parallel_pretrained(model, *ep_group, dir.string(), world->rank() == 0);
  world->barrier().wait();

  auto full = models::load_pretrained(dir.string());
  full->eval();
  {
    at::NoGradGuard no_grad;
    EXPECT_LE(ct::max_rel_diff(full->forward(ids), logits), 1e-5);
  }
  if (w == 4) {  // saved with ep 4, loaded with ep 2
    auto ep2 = world->split(world->rank() / 2, world->rank(), "ckpt_ep2");
    auto again = models::load_pretrained(dir.string());
    shard_experts(dynamic_cast<models::MixtralForCausalLM&>(*again), ep2);
    again->eval();
    at::NoGradGuard no_grad;
    EXPECT_LE(ct::max_rel_diff(again->forward(ids), logits), 1e-5);
  }
  world->barrier().wait();
  if (world->rank() == 0) {
    checkpoint::save_safetensors((dir / "cpp_logits.safetensors").string(),
                                 {{"input_ids", ids}, {"logits", logits}, {"aux_loss", aux}});
    auto result = ct::run_command(
        fmt::format("'{}' '{}' check '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_MIXTRAL_ORACLE, dir.string()));
    std::cout << result.output;
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("-> ok"), std::string::npos) << result.output;
    fs::remove_all(dir);
  }
  world->barrier().wait();
}

}  // namespace
}  // namespace colossus::moe
