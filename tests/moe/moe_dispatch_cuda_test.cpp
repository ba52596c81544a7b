// The CUDA dispatch kernels (kernels/moe_permute.h) inside SparseMoeBlock:
// forward and backward (input, router and expert gradients) on the GPU with
// the kernels against the same block on the CPU (the ATen reference), and
// against the GPU's ATen path in the same run; dropless and with capacity
// dropping (same dropped count), fp32 and bf16. Skipped without a CUDA device
// or in a build without the kernels.
#include "colossus/models/config.h"
#include "colossus/models/moe_layer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

namespace colossus::models {
namespace {

MixtralConfig config_of(std::optional<double> capacity_factor) {
  MixtralConfig c = MixtralConfig::defaults();
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_local_experts = 8;
  c.num_experts_per_tok = 2;
  c.capacity_factor = capacity_factor;
  return c;
}

struct Result {
  at::Tensor out, grad_x;
  std::map<std::string, at::Tensor> grads;
  int64_t dropped = 0;
};

// The block's parameters copied from `source` (CPU fp32), on `options`.
Result run(const SparseMoeBlock& source, const MixtralConfig& c, const at::TensorOptions& options, bool kernels,
           const at::Tensor& x_cpu, const at::Tensor& grad_cpu) {
  SparseMoeBlock moe(c, options);
  {
    at::NoGradGuard no_grad;
    auto from = source.named_parameters(/*recurse=*/true);
    for (auto& item : moe.named_parameters(/*recurse=*/true)) item.value().copy_(from[item.key()]);
  }
  moe.set_dispatch_kernels(kernels);
  // A copy: .to() returns x_cpu itself for CPU fp32, and requires_grad_ on
  // it would make every later run's x a non-leaf without .grad().
  at::Tensor x = x_cpu.detach().to(options, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
  at::Tensor out = moe.forward(x);
  out.backward(grad_cpu.to(options));
  Result r{.out = out.detach().cpu().to(at::kDouble), .grad_x = x.grad().cpu().to(at::kDouble)};
  for (const auto& item : moe.named_parameters(/*recurse=*/true)) {
    if (item.value().grad().defined()) r.grads[item.key()] = item.value().grad().cpu().to(at::kDouble);
  }
  r.dropped = moe.last_dropped();
  return r;
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

void expect_close(const Result& got, const Result& want, double tolerance, const std::string& label) {
  EXPECT_EQ(got.dropped, want.dropped) << label;
  EXPECT_LE(rel(got.out, want.out), tolerance) << label << " output";
  EXPECT_LE(rel(got.grad_x, want.grad_x), tolerance) << label << " input gradient";
  ASSERT_EQ(got.grads.size(), want.grads.size()) << label;
  for (const auto& [name, grad] : want.grads) {
    ASSERT_TRUE(got.grads.contains(name)) << label << " " << name;
    EXPECT_LE(rel(got.grads.at(name), grad), tolerance) << label << " " << name;
  }
}

TEST(MoeDispatchCuda, KernelsMatchTheCpuReferenceForwardAndBackward) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  if (!moe::dispatch_kernels_available(at::empty({1}, cuda))) GTEST_SKIP() << "built without the CUDA MoE kernels";
  for (std::optional<double> cf : {std::optional<double>{}, std::optional<double>{0.5}}) {
    const MixtralConfig c = config_of(cf);
    SparseMoeBlock source(c, at::TensorOptions().dtype(at::kFloat));
    {
      at::NoGradGuard no_grad;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
      for (auto& p : source.parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.2);
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
    const at::Tensor x = at::randn({3, 50, c.hidden_size}, gen);
    const at::Tensor grad = at::randn({3, 50, c.hidden_size}, gen);
    const std::string label = cf ? "capacity 0.5" : "dropless";
    const Result cpu = run(source, c, at::TensorOptions().dtype(at::kFloat), false, x, grad);
    if (cf) {
      EXPECT_GT(cpu.dropped, 0);
    }
    const Result kernel = run(source, c, cuda.dtype(at::kFloat), true, x, grad);
    const Result aten = run(source, c, cuda.dtype(at::kFloat), false, x, grad);
    // fp32 matmuls on the GPU (TF32 off by default in LibTorch) against the CPU's.
    expect_close(kernel, cpu, 1e-4, label + " fp32 kernels vs CPU");
    expect_close(kernel, aten, 1e-4, label + " fp32 kernels vs GPU ATen");
    // bf16: the same routing is not guaranteed (rounded logits), so compare
    // with the GPU's ATen path on the same bf16 block, loosely.
    const Result kernel_bf16 = run(source, c, cuda.dtype(at::kBFloat16), true, x, grad);
    const Result aten_bf16 = run(source, c, cuda.dtype(at::kBFloat16), false, x, grad);
    expect_close(kernel_bf16, aten_bf16, 2e-2, label + " bf16 kernels vs GPU ATen");
  }
}

}  // namespace
}  // namespace colossus::models
