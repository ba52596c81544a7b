// The fused CUDA layers (fused_layers.h): on CPU the models keep their ATen
// code (the fused entry points decline, forward_add is the sum then the norm,
// bit for bit); on CUDA (skipped without a device or without the kernels in
// the build) RMSNorm / LayerNorm with the residual, RoPE on q and k, and
// SwiGLU match the fp64 CPU reference, forward and every gradient, in fp32
// and bf16, and tiny LLaMA / GPT-2 training steps match the CPU.
#include "colossus/kernels/cuda_slots.h"
#include "colossus/models/fused_layers.h"
#include "colossus/models/layers.h"
#include "colossus/models/pretrained.h"
#include "colossus/models/rope.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace colossus::models {
namespace {

double rel_norm(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.detach().cpu().to(at::kDouble);
  return (got.detach().cpu().to(at::kDouble) - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

double bound_for(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 1e-2; }

// The kernels are in this build and there is a device to run them on.
bool cuda_kernels_here() {
  const auto& slots = kernels::cuda_slots();
  return at::hasCUDA() && slots.norm_forward != nullptr && slots.rope != nullptr && slots.swiglu_forward != nullptr;
}

TEST(FusedLayers, DeclineCpuTensors) {
  const at::Tensor x = at::randn({3, 64}), w = at::ones({64});
  EXPECT_FALSE(fused_rms_norm(x, x, w, 1e-6).has_value());
  EXPECT_FALSE(fused_layer_norm(x, at::Tensor(), w, w, 1e-5).has_value());
  const at::Tensor q = at::randn({1, 4, 2, 16}), cos = at::randn({4, 16});
  EXPECT_FALSE(fused_rope(q, q, cos, cos).has_value());
  EXPECT_FALSE(fused_swiglu(x, x).has_value());
}

TEST(FusedLayers, ForwardAddOnCpuIsTheSumThenTheNorm) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto options = at::TensorOptions().dtype(dtype);
    RMSNorm rms(64, 1e-6, options);
    LayerNorm ln(64, 1e-5, options);
    {
      at::NoGradGuard no_grad;
      rms.weight.copy_(at::rand({64}) + 0.5);
      ln.weight.copy_(at::rand({64}) + 0.5);
      ln.bias.copy_(at::randn({64}));
    }
    const at::Tensor x = at::randn({2, 5, 64}).to(dtype), residual = at::randn({2, 5, 64}).to(dtype);
    const at::Tensor sum = residual + x;
    const auto [rms_y, rms_sum] = rms.forward_add(x, residual);
    EXPECT_TRUE(at::equal(rms_sum, sum));
    EXPECT_TRUE(at::equal(rms_y, rms.forward(sum)));
    const auto [ln_y, ln_sum] = ln.forward_add(x, residual);
    EXPECT_TRUE(at::equal(ln_sum, sum));
    EXPECT_TRUE(at::equal(ln_y, ln.forward(sum)));
  }
}

// fp64 leaves on the CPU and their CUDA copies in `dtype` (rounded first, so
// both sides see the same values).
struct Inputs {
  std::vector<at::Tensor> cpu, cuda;
  Inputs(const std::vector<at::Tensor>& values, at::ScalarType dtype) {
    for (const auto& v : values) {
      const at::Tensor rounded = v.to(dtype);
      cpu.push_back(rounded.to(at::kDouble).requires_grad_(true));
      cuda.push_back(rounded.cuda().requires_grad_(true));
    }
  }
};

void expect_close(const std::string& what, const at::Tensor& got, const at::Tensor& want, at::ScalarType dtype) {
  ASSERT_TRUE(got.defined()) << what;
  const double err = rel_norm(got, want);
  EXPECT_TRUE(err <= bound_for(dtype)) << what << " " << c10::toString(dtype) << ": rel err " << err;
}

TEST(FusedLayers, CudaNormsMatchTheReference) {
  if (!cuda_kernels_here()) GTEST_SKIP() << "no CUDA device or no CUDA kernels in this build";
  const int64_t cols = 1032;  // 129 bf16 vectors: a partly idle second vector per thread
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (bool layer : {false, true}) {
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(std::string(layer ? "layer_norm" : "rms_norm") + (with_residual ? " +residual" : ""));
        Inputs in({at::randn({3, 100, cols}) * 2 + 0.5, at::randn({3, 100, cols}), at::rand({cols}) + 0.5,
                   at::randn({cols})},
                  dtype);
        const auto run = [&](const std::vector<at::Tensor>& t, bool fused) {
          const at::Tensor residual = with_residual ? t[1] : at::Tensor();
          if (fused) {
            auto out = layer ? fused_layer_norm(t[0], residual, t[2], t[3], 1e-5) : fused_rms_norm(t[0], residual, t[2], 1e-5);
            EXPECT_TRUE(out.has_value()) << "the fused path declined";
            return out.value_or(std::pair<at::Tensor, at::Tensor>{});
          }
          // The reference in fp64: the sum rounded like the kernel's, outside the gradient.
          at::Tensor s = t[0];
          if (with_residual) {
            const at::Tensor exact = t[0] + t[1];
            s = exact + (exact.detach().to(dtype).to(at::kDouble) - exact.detach());
          }
          const at::Tensor centred = layer ? s - s.mean(-1, true) : s;
          at::Tensor y = centred * at::rsqrt(centred.pow(2).mean(-1, true) + 1e-5) * t[2];
          if (layer) y = y + t[3];
          return std::pair{y, s};
        };
        const auto [y, s] = run(in.cuda, true);
        ASSERT_TRUE(y.defined());
        const auto [y_ref, s_ref] = run(in.cpu, false);
        const at::Tensor dy = at::randn(y.sizes()), ds = at::randn(y.sizes());
        at::Tensor loss = (y * dy.to(y.options())).sum(), loss_ref = (y_ref * dy.to(at::kDouble)).sum();
        if (with_residual) {
          loss = loss + (s * ds.to(s.options())).sum();
          loss_ref = loss_ref + (s_ref * ds.to(at::kDouble)).sum();
        }
        loss.to(at::kFloat).backward();
        loss_ref.backward();
        expect_close("y", y, y_ref, dtype);
        expect_close("sum", s, s_ref, dtype);
        expect_close("dx", in.cuda[0].grad(), in.cpu[0].grad(), dtype);
        expect_close("dweight", in.cuda[2].grad(), in.cpu[2].grad(), dtype);
        if (with_residual) expect_close("dresidual", in.cuda[1].grad(), in.cpu[1].grad(), dtype);
        if (layer) expect_close("dbias", in.cuda[3].grad(), in.cpu[3].grad(), dtype);
      }
    }
  }
}

TEST(FusedLayers, CudaRopeMatchesTheReference) {
  if (!cuda_kernels_here()) GTEST_SKIP() << "no CUDA device or no CUDA kernels in this build";
  const int64_t batch = 2, seq = 33, head_dim = 64;
  auto [cos, sin] = rope_cos_sin(RopeSpec{.head_dim = head_dim, .theta = 10000.0}, seq, at::TensorOptions());
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    Inputs in({at::randn({batch, seq, 8, head_dim}), at::randn({batch, seq, 2, head_dim})}, dtype);
    const at::Tensor c = cos.to(dtype), s = sin.to(dtype);
    auto fused = fused_rope(in.cuda[0], in.cuda[1], c.cuda(), s.cuda());
    ASSERT_TRUE(fused.has_value()) << "the fused path declined";
    const at::Tensor c64 = c.to(at::kDouble).unsqueeze(-2), s64 = s.to(at::kDouble).unsqueeze(-2);
    const at::Tensor q_ref = apply_rope(in.cpu[0], c64, s64), k_ref = apply_rope(in.cpu[1], c64, s64);
    const at::Tensor dq = at::randn(q_ref.sizes()), dk = at::randn(k_ref.sizes());
    ((fused->first * dq.to(fused->first.options())).sum() + (fused->second * dk.to(fused->second.options())).sum())
        .to(at::kFloat)
        .backward();
    ((q_ref * dq.to(at::kDouble)).sum() + (k_ref * dk.to(at::kDouble)).sum()).backward();
    expect_close("q", fused->first, q_ref, dtype);
    expect_close("k", fused->second, k_ref, dtype);
    expect_close("dq", in.cuda[0].grad(), in.cpu[0].grad(), dtype);
    expect_close("dk", in.cuda[1].grad(), in.cpu[1].grad(), dtype);
  }
}

TEST(FusedLayers, CudaSwigluMatchesTheReference) {
  if (!cuda_kernels_here()) GTEST_SKIP() << "no CUDA device or no CUDA kernels in this build";
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    Inputs in({at::randn({4, 37, 161}) * 3, at::randn({4, 37, 161})}, dtype);
    auto fused = fused_swiglu(in.cuda[0], in.cuda[1]);
    ASSERT_TRUE(fused.has_value()) << "the fused path declined";
    const at::Tensor ref = at::silu(in.cpu[0]) * in.cpu[1];
    const at::Tensor dout = at::randn(ref.sizes());
    (*fused * dout.to(fused->options())).sum().to(at::kFloat).backward();
    (ref * dout.to(at::kDouble)).sum().backward();
    expect_close("out", *fused, ref, dtype);
    expect_close("dgate", in.cuda[0].grad(), in.cpu[0].grad(), dtype);
    expect_close("dup", in.cuda[1].grad(), in.cpu[1].grad(), dtype);
  }
  // An expert no token was routed to: zero rows (null data) pass through.
  const at::Tensor empty = at::empty({0, 161}, at::TensorOptions(at::kBFloat16).device(at::kCUDA));
  EXPECT_FALSE(fused_swiglu(empty, empty).has_value()) << "an empty input takes the ATen path";
}

// A whole training step through the wiring (llama.cpp, gpt2.cpp, layers.cpp):
// fp32 on CUDA with the fused kernels against the same model on the CPU.
TEST(FusedLayers, CudaTrainingStepMatchesTheCpu) {
  if (!cuda_kernels_here()) GTEST_SKIP() << "no CUDA device or no CUDA kernels in this build";
  for (const char* name : {"llama-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    auto cpu = create_model(preset(name), {.seed = 5});
    auto gpu = create_model(preset(name), {.seed = 5});
    gpu->to(at::Device(at::kCUDA, 0));
    cpu->eval();  // no dropout; autograd still on
    gpu->eval();
    const at::Tensor ids = at::randint(0, 128, {2, 24}, at::kLong);
    const at::Tensor loss_cpu = cpu->loss(cpu->forward(ids), ids);
    const at::Tensor loss_gpu = gpu->loss(gpu->forward(ids.cuda()), ids.cuda());
    loss_cpu.backward();
    loss_gpu.backward();
    EXPECT_LE(rel_norm(loss_gpu, loss_cpu), 1e-4);
    const auto cpu_params = cpu->named_parameters(), gpu_params = gpu->named_parameters();
    for (const auto& item : cpu_params) {
      const at::Tensor& g = gpu_params[item.key()].grad();
      ASSERT_TRUE(g.defined()) << item.key();
      EXPECT_LE(rel_norm(g, item.value().grad()), 1e-3) << item.key();
    }
  }
}

}  // namespace
}  // namespace colossus::models
