// Mixtral and the MoE layer: parity with transformers' MixtralForCausalLM in
// both directions (logits, loss with the aux loss, gradients), the sorted
// dispatch against a per-token reference, capacity dropping, training, config
// errors.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/mixtral.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <iostream>

namespace colossus::models {
namespace {

namespace fs = std::filesystem;
using testing::max_abs_diff;
using testing::max_rel_diff;

constexpr double kTolerance = 1e-4;

class MixtralFromHf : public ::testing::TestWithParam<std::string> {};

TEST_P(MixtralFromHf, LogitsLossAuxLossAndGradientsMatchTransformers) {
  const fs::path dir = testing::hf_reference_dir() / GetParam();
  auto reference = checkpoint::load_state_dict((dir / "reference.safetensors").string());
  auto base = load_pretrained(dir.string());
  auto* model = dynamic_cast<MixtralForCausalLM*>(base.get());
  ASSERT_NE(model, nullptr);
  model->eval();
  at::Tensor logits = model->forward(reference.at("input_ids"));
  EXPECT_LE(max_abs_diff(logits, reference.at("logits")), kTolerance);
  EXPECT_NEAR(model->aux_loss().item<double>(), reference.at("aux_loss").item<double>(), kTolerance);
  at::Tensor loss = model->moe_loss(logits, reference.at("labels"));
  EXPECT_NEAR(loss.item<double>(), reference.at("loss").item<double>(), kTolerance);
  loss.backward();
  size_t compared = 0;
  for (const auto& item : model->named_parameters()) {
    auto hf_grad = reference.find("grad." + item.key());
    ASSERT_NE(hf_grad, reference.end()) << "HF has no parameter " << item.key();
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_LE(max_rel_diff(item.value().grad(), hf_grad->second), kTolerance) << item.key();
    ++compared;
  }
  size_t hf_params = 0;
  for (const auto& [key, _] : reference) hf_params += key.starts_with("grad.");
  EXPECT_EQ(compared, hf_params);
}

INSTANTIATE_TEST_SUITE_P(Cases, MixtralFromHf, ::testing::Values("mixtral_top2", "mixtral_top1", "mixtral_window"));

MixtralConfig tiny(int64_t experts = 4, int64_t top_k = 2) {
  auto c = std::get<MixtralConfig>(preset("mixtral-tiny"));
  c.initializer_range = 0.2;
  c.num_local_experts = experts;
  c.num_experts_per_tok = top_k;
  return c;
}

TEST(MixtralToHf, TransformersLoadsOurCheckpointAndAgrees) {
  std::string dirs;
  std::vector<std::pair<std::string, MixtralConfig>> cases = {{"cpp_mixtral_top2", tiny(4, 2)},
                                                              {"cpp_mixtral_top1_tied", tiny(8, 1)}};
  cases[1].second.tie_word_embeddings = true;
  uint64_t seed = 5;
  for (const auto& [name, config] : cases) {
    auto base = create_model(config, {.seed = seed});
    auto& model = dynamic_cast<MixtralForCausalLM&>(*base);
    testing::perturb_parameters(model, seed + 100);
    model.eval();
    at::Tensor ids = testing::random_ids(2, 16, config.vocab_size, seed);
    at::NoGradGuard no_grad;
    at::Tensor logits = model.forward(ids);
    at::Tensor aux = model.aux_loss().reshape({1});
    const fs::path dir = testing::scratch_dir() / name;
    save_pretrained(model, dir.string());
    checkpoint::save_safetensors((dir / "cpp_logits.safetensors").string(),
                                 {{"input_ids", ids}, {"logits", logits}, {"aux_loss", aux}});
    dirs += fmt::format(" '{}'", dir.string());
    ++seed;
  }
  testing::PythonResult result = testing::run_oracle("check" + dirs);
  std::cout << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  size_t ok_lines = 0;
  for (size_t pos = 0; (pos = result.output.find("-> ok", pos)) != std::string::npos; ++pos) ++ok_lines;
  EXPECT_EQ(ok_lines, cases.size()) << result.output;
}

// Per-token reference: each token through its top-k experts, one at a time.
at::Tensor naive_moe(SparseMoeBlock& moe, const at::Tensor& x, int64_t capacity, int64_t* dropped) {
  at::Tensor logits = moe.layer("gate").forward(x);
  moe::Routing r = moe::route(logits, moe.top_k());
  std::vector<int64_t> used(moe.num_experts(), 0);
  at::Tensor out = at::zeros_like(x);
  *dropped = 0;
  for (int64_t t = 0; t < x.size(0); ++t) {
    for (int64_t s = 0; s < moe.top_k(); ++s) {
      const int64_t e = r.experts[t][s].item<int64_t>();
      if (used[e]++ >= capacity) {
        ++*dropped;
        continue;
      }
      out[t] += r.weights[t][s] * moe.expert(e).forward(x[t].unsqueeze(0))[0];
    }
  }
  return out;
}

TEST(SparseMoeBlock, SortedDispatchMatchesPerTokenReferenceDroplessAndWithCapacity) {
  for (std::optional<double> cf : {std::optional<double>{}, std::optional<double>{1.0}, std::optional<double>{0.5}}) {
    for (int64_t k : {1, 2}) {
      MixtralConfig c = tiny(4, k);
      c.capacity_factor = cf;
      SparseMoeBlock moe(c, at::TensorOptions().dtype(at::kFloat));
      {
        at::NoGradGuard no_grad;
        for (auto& p : moe.parameters()) p.zero_();  // constructed uninitialised
      }
      testing::perturb_parameters(moe, 7 + k, 0.3);
      at::Tensor x = at::randn({2, 12, c.hidden_size}, at::make_generator<at::CPUGeneratorImpl>(3 + k));
      at::NoGradGuard no_grad;
      at::Tensor y = moe.forward(x);
      const int64_t capacity = cf ? moe::expert_capacity(*cf, 24, k, 4) : int64_t{1} << 40;
      int64_t dropped = 0;
      at::Tensor expected = naive_moe(moe, x.reshape({24, -1}), capacity, &dropped);
      EXPECT_LE(max_rel_diff(y.reshape({24, -1}), expected), 1e-5) << "k=" << k << " cf=" << cf.value_or(0);
      EXPECT_EQ(moe.last_dropped(), dropped) << "k=" << k << " cf=" << cf.value_or(0);
      if (cf && *cf == 0.5) {
        EXPECT_GT(dropped, 0);
      }
      if (!cf) {
        EXPECT_EQ(dropped, 0);
      }
    }
  }
}

TEST(SparseMoeBlock, GroupedGemmPathEqualsThePerExpertLoopIncludingEmptyExperts) {
  // 8 experts, top-1, 6 tokens: some experts get no rows. The grouped path runs without autograd.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    MixtralConfig c = tiny(8, 1);
    SparseMoeBlock moe(c, at::TensorOptions().dtype(dtype));
    at::NoGradGuard no_grad;
    for (auto& p : moe.parameters()) p.zero_();
    testing::perturb_parameters(moe, 11, 0.3);
    ASSERT_TRUE(moe.grouped_gemm_ready()) << "hidden " << c.hidden_size << ", intermediate " << c.intermediate_size;
    at::Tensor x = at::randn({2, 3, c.hidden_size}, at::make_generator<at::CPUGeneratorImpl>(5)).to(dtype);
    at::Tensor grouped = moe.forward(x).to(at::kFloat);
    moe.set_grouped_gemm(false);
    at::Tensor looped = moe.forward(x).to(at::kFloat);
    moe.set_grouped_gemm(true);
    const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
    EXPECT_TRUE(at::isfinite(grouped).all().item<bool>());
    EXPECT_GT(looped.abs().max().item<double>(), 0.0);
    EXPECT_LE(max_abs_diff(grouped, looped), tolerance * std::max(1.0, looped.abs().max().item<double>()))
        << "dtype " << dtype;
    // A parameter re-pointed elsewhere (as a ZeRO bucket does) turns the grouped path off, never wrong.
    at::Tensor& w1 = moe.expert(0).layer_as<Linear>("w1").weight;
    w1.set_data(w1.clone());
    EXPECT_FALSE(moe.grouped_gemm_ready());
    EXPECT_LE(max_abs_diff(moe.forward(x).to(at::kFloat), looped), 1e-6);
    moe.pack_experts();
    EXPECT_TRUE(moe.grouped_gemm_ready());
  }
}

// Training through the grouped GEMMs: the input and every expert weight get
// the per-expert loop's gradients, experts without rows a zero gradient.
void expect_grouped_backward_equals_the_loop(const at::Device& device, at::ScalarType dtype) {
  SCOPED_TRACE(fmt::format("{} {}", device.str(), c10::toString(dtype)));
  MixtralConfig c = tiny(8, 1);
  SparseMoeBlock moe(c, at::TensorOptions().dtype(dtype).device(device));
  {
    at::NoGradGuard no_grad;
    for (auto& p : moe.parameters()) p.zero_();
    testing::perturb_parameters(moe, 13, 0.3);
  }
  const at::Tensor x0 =
      at::randn({2, 3, c.hidden_size}, at::make_generator<at::CPUGeneratorImpl>(6)).to(device, dtype);
  const at::Tensor upstream = at::randn({2, 3, c.hidden_size}, at::make_generator<at::CPUGeneratorImpl>(7)).to(device);
  auto gradients = [&](bool grouped) {
    moe.set_grouped_gemm(grouped);
    moe.zero_grad();
    at::Tensor x = x0.clone().requires_grad_(true);
    (moe.forward(x).to(at::kFloat) * upstream).sum().backward();
    EXPECT_EQ(moe.last_ran_grouped(), grouped);
    std::vector<at::Tensor> out{x.grad().to(at::kCPU, at::kFloat)};
    for (const auto& p : moe.parameters()) {
      out.push_back(p.grad().defined() ? p.grad().to(at::kCPU, at::kFloat) : at::zeros(p.sizes(), at::kFloat));
    }
    return out;
  };
  const auto looped = gradients(false);
  const auto grouped = gradients(true);
  ASSERT_EQ(grouped.size(), looped.size());
  const double tolerance = dtype == at::kFloat ? 1e-5 : 3e-2;
  int empty_experts = 0;
  for (size_t i = 0; i < looped.size(); ++i) {
    EXPECT_LE(max_abs_diff(grouped[i], looped[i]), tolerance * std::max(1.0, looped[i].abs().max().item<double>()))
        << "gradient " << i;
    if (i > 0 && looped[i].abs().max().item<double>() == 0.0) {
      ++empty_experts;
      EXPECT_EQ(grouped[i].abs().max().item<double>(), 0.0) << "an expert without rows gets a zero gradient";
    }
  }
  EXPECT_GT(empty_experts, 0) << "6 tokens top-1 over 8 experts leaves some without rows";
}

TEST(SparseMoeBlock, GroupedGemmBackwardEqualsThePerExpertLoop) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) expect_grouped_backward_equals_the_loop(at::kCPU, dtype);
}

// On a GPU (scripts/device_moe.sh): the same through CUDA's grouped GEMM.
TEST(SparseMoeBlock, CudaGroupedGemmBackwardEqualsThePerExpertLoop) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    expect_grouped_backward_equals_the_loop(at::Device(at::kCUDA, 0), dtype);
  }
}

TEST(SparseMoeBlock, OddWidthsAndDoubleFallBackToTheLoop) {
  MixtralConfig c = tiny(4, 2);
  c.intermediate_size = 18;  // 72-byte fp32 rows: not a 16-byte multiple
  SparseMoeBlock odd(c, at::TensorOptions().dtype(at::kFloat));
  EXPECT_FALSE(odd.grouped_gemm_ready());
  SparseMoeBlock dbl(tiny(4, 2), at::TensorOptions().dtype(at::kDouble));
  EXPECT_FALSE(dbl.grouped_gemm_ready());
  at::NoGradGuard no_grad;
  for (auto& p : dbl.parameters()) p.zero_();  // constructed uninitialised
  testing::perturb_parameters(dbl, 3, 0.3);
  EXPECT_TRUE(at::isfinite(dbl.forward(at::randn({1, 5, tiny().hidden_size}, at::kDouble))).all().item<bool>());
}

TEST(MixtralForCausalLM, TrainingStepsReduceTheLossAndEveryParameterGetsAGradient) {
  MixtralConfig c = tiny(4, 2);
  c.initializer_range = 0.02;
  c.output_router_logits = true;
  c.router_z_loss_coef = 1e-3;
  auto base = create_model(c, {.seed = 1});
  auto& model = dynamic_cast<MixtralForCausalLM&>(*base);
  model.train();
  at::Tensor ids = testing::random_ids(4, 16, c.vocab_size, 9);
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    model.zero_grad();
    at::Tensor loss = model.moe_loss(model.forward(ids), ids);
    loss.backward();
    losses.push_back(loss.item<double>());
    at::NoGradGuard no_grad;
    for (const auto& item : model.named_parameters()) {
      if (step == 0) {
        ASSERT_TRUE(item.value().grad().defined()) << item.key() << " got no gradient";
      }
      if (item.value().grad().defined()) item.value().sub_(item.value().grad(), 0.5);
    }
  }
  EXPECT_LT(losses.back(), losses.front() - 0.1) << fmt::format("{}", fmt::join(losses, ", "));
}

std::string config_error(const MixtralConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(MixtralConfig, BadRoutingSettingsAreClearConfigErrors) {
  EXPECT_NE(config_error(tiny(4, 5)).find("num_experts_per_tok (top-k) is 5"), std::string::npos)
      << config_error(tiny(4, 5));
  EXPECT_NE(config_error(tiny(4, 0)).find("num_experts_per_tok (top-k) is 0"), std::string::npos);
  MixtralConfig c = tiny();
  c.capacity_factor = 0.0;
  EXPECT_NE(config_error(c).find("capacity_factor is 0"), std::string::npos);
  c = tiny();
  c.sliding_window = 0;
  EXPECT_NE(config_error(c).find("sliding_window is 0"), std::string::npos);
  EXPECT_THROW(create_model(tiny(2, 3)), ConfigError);
  // config.json with top-k > experts is refused on read as well.
  std::string json = config_to_json(tiny());
  json.replace(json.find("\"num_experts_per_tok\": 2"), 24, "\"num_experts_per_tok\": 9");
  EXPECT_THROW(config_from_json(json), ConfigError);
}

TEST(MixtralConfig, HfConfigJsonRoundTripsWithMoeFields) {
  MixtralConfig c = tiny(8, 1);
  c.router_aux_loss_coef = 0.02;
  c.capacity_factor = 1.25;
  ModelConfig back = config_from_json(config_to_json(c));
  ASSERT_TRUE(std::holds_alternative<MixtralConfig>(back));
  const auto& m = std::get<MixtralConfig>(back);
  EXPECT_EQ(model_type(back), "mixtral");
  EXPECT_EQ(m.num_local_experts, 8);
  EXPECT_EQ(m.num_experts_per_tok, 1);
  EXPECT_DOUBLE_EQ(m.router_aux_loss_coef, 0.02);
  EXPECT_EQ(m.capacity_factor, 1.25);
  EXPECT_TRUE(m.extra.empty());
  const std::string json = config_to_json(preset("mixtral-tiny"));
  EXPECT_EQ(config_to_json(config_from_json(json)), json);
}

}  // namespace
}  // namespace colossus::models
