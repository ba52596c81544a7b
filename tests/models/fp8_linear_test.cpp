// FP8 linear layers (models/fp8_linear.h) on the CPU: the forward and both
// gradients equal the same FP8 values multiplied in fp64 (the mechanics:
// scales, formats, layouts), and stay within FP8's rounding of the fp32
// linear; rowwise scaling is no worse than per tensor on rows of very
// different size; enable_fp8 swaps the middle blocks' Linear layers and keeps
// every parameter name and tensor (the training curve against fp32 is
// trainer_test's Fp8LinearLayersTrackTheFullPrecisionCurve).
#include "colossus/core/errors.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/fp8_linear.h"
#include "colossus/models/pretrained.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace colossus;
using namespace colossus::models;

namespace {

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want.to(at::kDouble)).norm() / want.to(at::kDouble).norm()).item<double>();
}

// x quantised as the layer does: per tensor or per row, to `format`.
at::Tensor fp8_values(const at::Tensor& x, at::ScalarType format, bool rowwise) {
  const double top = format == at::kFloat8_e5m2 ? 57344.0 : 448.0;
  const at::Tensor x64 = x.to(at::kDouble);
  at::Tensor amax = rowwise ? x64.abs().amax({-1}, true) : x64.abs().max();
  const at::Tensor scale = (amax / top).to(at::kFloat).to(at::kDouble);
  return (x64 / scale).clamp(-top, top).to(at::kFloat).to(format).to(at::kDouble) * scale;
}

// x in e4m3 per tensor, scaled by a given maximum (delayed scaling).
at::Tensor fp8_values_with_amax(const at::Tensor& x, double amax) {
  const double top = 448.0;
  const double scale = static_cast<double>(static_cast<float>(amax) / static_cast<float>(top));
  return (x.to(at::kDouble) / scale).clamp(-top, top).to(at::kFloat).to(at::kFloat8_e4m3fn).to(at::kDouble) * scale;
}

}  // namespace

TEST(Fp8Linear, ForwardAndGradientsAreTheFp8ValuesMultiplied) {
  at::manual_seed(0);
  for (bool rowwise : {false, true}) {
    for (const char* grad_format : {"e5m2", "e4m3"}) {
      const at::Tensor x = at::randn({3, 16, 64}).requires_grad_(true);
      const at::Tensor w = (at::randn({48, 64}) * 0.1).requires_grad_(true);
      const at::Tensor b = at::randn({48}).requires_grad_(true);
      const at::Tensor dy = at::randn({3, 16, 48});
      const at::Tensor y = fp8_linear(x, w, b, {.rowwise = rowwise, .grad_format = grad_format});
      y.backward(dy);
      // The same FP8 values in fp64.
      const at::Tensor x2 = x.detach().reshape({-1, 64});
      const at::Tensor want_y = at::matmul(fp8_values(x2, at::kFloat8_e4m3fn, rowwise),
                                           fp8_values(w.detach(), at::kFloat8_e4m3fn, rowwise).t()) +
                                b.detach().to(at::kDouble);
      EXPECT_LT(rel_err(y.detach().reshape({-1, 48}), want_y), 1e-6) << "rowwise " << rowwise;
      const auto gf = std::string(grad_format) == "e4m3" ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
      const at::Tensor dyq = fp8_values(dy.reshape({-1, 48}), gf, false);
      const at::Tensor want_dx = at::matmul(dyq, fp8_values(w.detach(), at::kFloat8_e4m3fn, false));
      const at::Tensor want_dw = at::matmul(dyq.t(), fp8_values(x2, at::kFloat8_e4m3fn, false));
      EXPECT_LT(rel_err(x.grad().reshape({-1, 64}), want_dx), 1e-6) << grad_format;
      EXPECT_LT(rel_err(w.grad(), want_dw), 1e-6) << grad_format;
      EXPECT_LT(rel_err(b.grad(), dy.sum(at::IntArrayRef{0, 1})), 1e-6);
      // And within FP8's rounding of the exact linear (e4m3: 3 mantissa bits,
      // e5m2: 2; errors of random signs partly cancel over 64 or 48 terms).
      const at::Tensor exact = at::linear(x.detach(), w.detach(), b.detach());
      EXPECT_LT(rel_err(y.detach(), exact), 0.05);
      const double grad_bound = std::string(grad_format) == "e5m2" ? 0.10 : 0.05;
      EXPECT_LT(rel_err(x.grad(), at::matmul(dy, w.detach())), grad_bound);
      EXPECT_GT(rel_err(y.detach(), exact), 1e-4) << "the forward did not quantise";
    }
  }
}

// fused_quantize asks for the CUDA kernel (kernels/fp8_quantize.h, checked
// to the bit against this formula by `colossus check`'s fp8_quantize); off
// CUDA it falls back to the ATen formula, so the results are the same bits.
TEST(Fp8Linear, FusedQuantizeOffCudaIsTheAtenPath) {
  at::manual_seed(1);
  for (bool rowwise : {false, true}) {
    const at::Tensor x = at::randn({4, 16, 64});
    const at::Tensor w = at::randn({32, 64}) * 0.1, dy = at::randn({4, 16, 32});
    std::vector<at::Tensor> results;
    for (bool fused : {false, true}) {
      const at::Tensor xi = x.clone().requires_grad_(true), wi = w.clone().requires_grad_(true);
      const at::Tensor y = fp8_linear(xi, wi, at::Tensor(), {.rowwise = rowwise, .fused_quantize = fused});
      y.backward(dy);
      results.insert(results.end(), {y.detach(), xi.grad(), wi.grad()});
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(results[i], results[i + 3])) << "rowwise " << rowwise << " " << i;
  }
}

TEST(Fp8Linear, RowwiseScalesHelpRowsOfDifferentSizes) {
  at::manual_seed(1);
  // Rows whose magnitudes span 1e7, past e4m3's range (448 down to 2^-9):
  // one per-tensor scale flushes the small rows to zero; per-row scales keep them.
  const at::Tensor x = at::randn({8, 64}) * at::pow(10.0, at::arange(8, at::kFloat)).unsqueeze(1);
  const at::Tensor w = at::randn({32, 64}) * 0.1;
  const at::Tensor exact = at::linear(x, w);
  const at::Tensor tensorwise = fp8_linear(x, w, at::Tensor(), {.rowwise = false});
  const at::Tensor rowwise = fp8_linear(x, w, at::Tensor(), {.rowwise = true});
  const double small_tensorwise = rel_err(tensorwise.narrow(0, 0, 2), exact.narrow(0, 0, 2));
  const double small_rowwise = rel_err(rowwise.narrow(0, 0, 2), exact.narrow(0, 0, 2));
  EXPECT_LT(small_rowwise, 0.05);
  EXPECT_LT(small_rowwise, small_tensorwise / 2) << small_rowwise << " vs " << small_tensorwise;
}

// Delayed scaling: the first use (no history) scales x and W by their
// current maxima, exactly as current scaling does; each use records its
// maximum, newest first; a later, smaller input is scaled by the largest
// past maximum (so it is not the current-scaling result), and one beyond
// the history saturates at the format's largest value.
TEST(Fp8Linear, DelayedScalingUsesTheLargestPastMaximum) {
  const models::Fp8Recipe delayed{.amax_history_len = 4};
  at::manual_seed(3);
  auto base = std::make_shared<models::Linear>(at::randn({24, 16}).requires_grad_(true), at::Tensor());
  models::Fp8Linear layer(*base, delayed);
  const at::Tensor x1 = at::randn({8, 16}) * 4;
  const at::Tensor y1 = layer.forward(x1);
  EXPECT_TRUE(at::equal(y1, fp8_linear(x1, base->weight, at::Tensor(), {})))
      << "no history yet: the current maximum";
  y1.sum().backward();
  const auto& history = layer.amax_history();
  ASSERT_TRUE(history.x.defined() && history.w.defined() && history.dy.defined());
  EXPECT_EQ(history.x.numel(), 4);
  EXPECT_FLOAT_EQ(history.x[0].item<float>(), x1.abs().max().item<float>());
  EXPECT_EQ(history.x[1].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(history.dy[0].item<float>(), 1.0f) << "d(sum)/dy is all ones";

  const at::Tensor x2 = x1 / 3;  // smaller: scaled by x1's maximum, coarser than its own (not a power of 2)
  const at::Tensor y2 = layer.forward(x2).detach();
  const at::Tensor want2 = at::matmul(fp8_values_with_amax(x2, x1.abs().max().item<double>()),
                                      fp8_values(base->weight.detach(), at::kFloat8_e4m3fn, false).t());
  EXPECT_LT(rel_err(y2, want2), 1e-6);
  EXPECT_GT(rel_err(y2, fp8_linear(x2, base->weight, at::Tensor(), {}).detach()), 1e-4)
      << "a smaller input must not be scaled by its own maximum";
  EXPECT_FLOAT_EQ(history.x[0].item<float>(), x2.abs().max().item<float>());
  EXPECT_FLOAT_EQ(history.x[1].item<float>(), x1.abs().max().item<float>());

  const at::Tensor x3 = x1 * 4;  // beyond the history: saturates at 448 x the past scale
  const at::Tensor y3 = layer.forward(x3).detach();
  const at::Tensor want3 = at::matmul(fp8_values_with_amax(x3, x1.abs().max().item<double>()),
                                      fp8_values(base->weight.detach(), at::kFloat8_e4m3fn, false).t());
  EXPECT_LT(rel_err(y3, want3), 1e-6);

  // Evaluation (no grad) reads the history but does not add to it.
  const at::Tensor before = history.x.clone();
  {
    at::NoGradGuard no_grad;
    layer.forward(x1 * 100);
  }
  EXPECT_TRUE(at::equal(history.x, before));

  for (const models::Fp8Recipe& bad : {models::Fp8Recipe{.amax_history_len = -1},
                                      models::Fp8Recipe{.rowwise = true, .amax_history_len = 8}}) {
    EXPECT_THROW(bad.validate(), ConfigError);
  }
}

// keep_weight_for_backward = false (Gemini's trainer path: W quantised again
// in the backward at the forward's scale instead of its FP8 W^T kept) gives
// the same output and gradients, bit for bit, with current and with delayed
// scaling.
TEST(Fp8Linear, RequantisingTheWeightInBackwardChangesNothing) {
  at::manual_seed(5);
  const at::Tensor w0 = at::randn({24, 16}), x0 = at::randn({2, 8, 16});
  for (const int64_t history_len : {int64_t{0}, int64_t{4}}) {
    std::vector<at::Tensor> results;
    for (const bool keep : {true, false}) {
      auto base = std::make_shared<models::Linear>(w0.clone().requires_grad_(true), at::Tensor());
      models::Fp8Linear layer(*base, {.amax_history_len = history_len, .keep_weight_for_backward = keep});
      for (int call = 0; call < 2; ++call) {  // the second call scales from the history when delayed
        at::Tensor x = (x0 * (call + 1)).requires_grad_(true);
        at::Tensor y = layer.forward(x);
        (y * y).sum().backward();
        results.insert(results.end(), {y.detach(), x.grad(), base->weight.grad().clone()});
        base->weight.mutable_grad().zero_();
      }
    }
    const size_t half = results.size() / 2;
    for (size_t i = 0; i < half; ++i) {
      EXPECT_TRUE(at::equal(results[i], results[i + half])) << "history " << history_len << ", tensor " << i;
    }
  }
}

// Layers reading the same x (q/k/v_proj) share its quantisation: each one's
// output and gradients are what it computes alone, and an x changed in place
// between two layers is quantised again (a stale FP8 copy would not follow).
TEST(Fp8Linear, LayersOnTheSameInputShareItsQuantisationButNotAStaleOne) {
  at::manual_seed(9);
  const at::Tensor w1 = at::randn({24, 16}), w2 = at::randn({8, 16});
  const at::Tensor x0 = at::randn({2, 8, 16});
  const auto run = [&](bool shared, bool change_between) {
    auto a = std::make_shared<models::Linear>(w1.clone().requires_grad_(true), at::Tensor());
    auto b = std::make_shared<models::Linear>(w2.clone().requires_grad_(true), at::Tensor());
    models::Fp8Linear fa(*a, {}), fb(*b, {});
    at::Tensor leaf = x0.clone().requires_grad_(true);
    at::Tensor x = leaf * 1.0;  // a non-leaf, as a norm's output
    const at::Tensor ya = fa.forward(shared ? x : x.clone());
    if (change_between) {
      at::NoGradGuard no_grad;
      x.mul_(3.0);
    }
    const at::Tensor yb = fb.forward(x);
    if (!change_between) (ya.sum() + (yb * yb).sum()).backward();
    return std::vector<at::Tensor>{ya.detach(), yb.detach(),
                                   change_between ? at::Tensor() : leaf.grad(),
                                   change_between ? at::Tensor() : a->weight.grad(),
                                   change_between ? at::Tensor() : b->weight.grad()};
  };
  const auto shared = run(true, false), separate = run(false, false);
  for (size_t i = 0; i < shared.size(); ++i) EXPECT_TRUE(at::equal(shared[i], separate[i])) << "tensor " << i;
  const auto changed = run(true, true);
  const at::Tensor want = fp8_linear(x0 * 3.0, w2, at::Tensor(), {});
  EXPECT_TRUE(at::equal(changed[1], want.detach())) << "the second layer read a stale FP8 copy";
}

TEST(Fp8Linear, RefusesAnUnknownGradFormat) {
  try {
    Fp8Recipe{.grad_format = "e3m4"}.validate();
    ADD_FAILURE() << "e3m4 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("e3m4"), std::string::npos) << e.what();
  }
}

namespace {

ModelConfig tiny_llama() {
  LlamaConfig c;
  c.vocab_size = 96, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 4;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  return c;
}

}  // namespace

// Delayed scaling inside activation checkpointing's rerun is refused by name
// (the rerun would quantise at moved scales); current scaling reruns fine.
TEST(Fp8Linear, DelayedScalingRefusesTheCheckpointRerun) {
  for (const int64_t history_len : {int64_t{0}, int64_t{4}}) {
    auto model = create_model(tiny_llama(), {.seed = 7});
    enable_fp8(*model, {.amax_history_len = history_len}, /*keep_first_last=*/false);
    enable_activation_checkpointing(*model, 1.0);
    const at::Tensor ids = at::randint(0, 64, {2, 8});
    const at::Tensor loss = model->loss(model->forward(ids), ids);
    if (history_len == 0) {
      EXPECT_NO_THROW(loss.backward());
    } else {
      try {
        loss.backward();
        ADD_FAILURE() << "expected the rerun to be refused";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("activation checkpointing"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Fp8Linear, EnableFp8KeepsNamesAndTensors) {
  auto model = create_model(tiny_llama(), {.seed = 7});
  std::vector<std::pair<std::string, const void*>> before, after;
  for (const auto& p : model->named_parameters()) before.emplace_back(p.key(), p.value().data_ptr());
  EXPECT_EQ(enable_fp8(*model, {.rowwise = true}), 14);
  for (const auto& p : model->named_parameters()) after.emplace_back(p.key(), p.value().data_ptr());
  EXPECT_EQ(after, before);
  EXPECT_EQ(enable_fp8(*model, {}), 0) << "Fp8Linear layers are not replaced again";
  auto all = create_model(tiny_llama(), {.seed = 7});
  EXPECT_EQ(enable_fp8(*all, {}, /*keep_first_last=*/false), 28);
  // GPT-2's Conv1D layers (c_attn, c_proj, c_fc, mlp c_proj) too, with the same y.
  GPT2Config gpt2;
  gpt2.vocab_size = 96, gpt2.n_positions = 32, gpt2.n_embd = 64, gpt2.n_layer = 2, gpt2.n_head = 4;
  auto g = create_model(gpt2, {.seed = 7});
  g->eval();
  const at::Tensor ids = at::randint(96, {2, 16}, at::kLong);
  const at::Tensor before_logits = g->forward(ids).detach();
  EXPECT_EQ(enable_fp8(*g, {}), 8);
  const at::Tensor after_logits = g->forward(ids).detach();
  EXPECT_LT(rel_err(after_logits, before_logits), 0.05);
  EXPECT_GT(rel_err(after_logits, before_logits), 0.0);
}
