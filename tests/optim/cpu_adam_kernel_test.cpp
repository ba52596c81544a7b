// The fused Adam kernels behind HybridAdam: every CPU ISA and thread count
// equals the scalar reference bit for bit; HybridAdam feeds the kernel the
// right constants (checked against the reference on its own), falls back for
// tensors the kernel cannot take, and on CUDA (when present) equals the CPU.
#include "colossus/kernels/adam.h"
#include "colossus/kernels/cpu/thread_pool.h"
#include "colossus/kernels/registry.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/hybrid_adam.h"
#include "tests/optim/torch_oracle.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace colossus::optim {
namespace {

using kernels::AdamTensorPtrs;
using kernels::CpuIsa;

struct Buffers {
  at::Tensor p, g, m, v;
  AdamTensorPtrs ptrs() {
    return {p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel()};
  }
  Buffers clone() const { return {p.clone(), g.clone(), m.clone(), v.clone()}; }
};

Buffers random_buffers(int64_t n) {
  return {at::randn({n}), at::randn({n}) * 0.1, at::randn({n}) * 1e-2, at::rand({n}) * 1e-3};
}

TEST(CpuAdamKernel, EveryIsaAndThreadCountEqualsTheReference) {
  const std::vector<int64_t> sizes = {1, 8, 15, 16, 31, 33, 4097, 65536 * 3 + 5, 1 << 20};
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!kernels::cpu_supports(isa)) {
      std::printf("[ skipped  ] %s is not supported by this CPU\n", kernels::isa_name(isa).c_str());
      continue;
    }
    for (int threads : {1, 2, 5}) {
      for (bool decoupled : {true, false}) {
        std::vector<Buffers> got, expected;
        for (int64_t n : sizes) {
          got.push_back(random_buffers(n));
          expected.push_back(got.back().clone());
        }
        for (int64_t step = 1; step <= 3; ++step) {
          const auto h = kernels::make_adam_hyper(1e-3, 0.9, 0.95, 1e-8, 0.1, decoupled, true, step);
          std::vector<AdamTensorPtrs> table;
          for (auto& b : got) table.push_back(b.ptrs());
          kernels::adam_step_cpu(table.data(), static_cast<int64_t>(table.size()), h, threads, isa);
          for (auto& b : expected) {
            auto ptrs = b.ptrs();
            kernels::adam_step_reference(ptrs, h);
          }
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
          const auto where = fmt::format("{} x{} decoupled={} n={}", kernels::isa_name(isa), threads, decoupled, sizes[i]);
          ASSERT_TRUE(at::equal(got[i].p, expected[i].p)) << where;
          ASSERT_TRUE(at::equal(got[i].m, expected[i].m)) << where;
          ASSERT_TRUE(at::equal(got[i].v, expected[i].v)) << where;
        }
      }
    }
  }
}

// The threads come from a persistent pool: started once, never per call, and
// callers on several threads at once (Gemini's host worker beside the main
// thread) each get the result of their own call alone.
TEST(CpuAdamKernel, PoolThreadsStartOnceAndConcurrentCallsAgree) {
  const CpuIsa isa = kernels::best_cpu_isa();
  const auto h = kernels::make_adam_hyper(1e-3, 0.9, 0.95, 1e-8, 0.1, true, true, 1);
  auto run = [&](std::vector<Buffers>& buffers, int threads, int steps) {
    std::vector<AdamTensorPtrs> table;
    for (auto& b : buffers) table.push_back(b.ptrs());
    for (int step = 0; step < steps; ++step) {
      kernels::adam_step_cpu(table.data(), static_cast<int64_t>(table.size()), h, threads, isa);
    }
  };
  std::vector<Buffers> warm = {random_buffers(1 << 20)};
  run(warm, 4, 1);
  const int started = kernels::detail::cpu_pool_threads_started();
  EXPECT_GE(started, 1);
  run(warm, 4, 50);
  run(warm, 0, 50);
  EXPECT_EQ(kernels::detail::cpu_pool_threads_started(), started) << "no thread started after the first call";

  std::vector<Buffers> a = {random_buffers(1 << 20), random_buffers(300000)}, b = {random_buffers(1 << 19)};
  std::vector<Buffers> a_alone, b_alone;
  for (auto& x : a) a_alone.push_back(x.clone());
  for (auto& x : b) b_alone.push_back(x.clone());
  run(a_alone, 1, 5);
  run(b_alone, 1, 5);
  std::thread other([&] { run(b, 3, 5); });
  run(a, 5, 5);
  other.join();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].p, a_alone[i].p) && at::equal(a[i].v, a_alone[i].v));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(at::equal(b[i].p, b_alone[i].p) && at::equal(b[i].m, b_alone[i].m));
}

TEST(CpuAdamKernel, UnsupportedIsaIsAConfigError) {
  if (kernels::cpu_supports(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU supports every ISA";
  auto b = random_buffers(16);
  auto ptrs = b.ptrs();
  const auto h = kernels::make_adam_hyper(1e-3, 0.9, 0.999, 1e-8, 0.0, true, true, 1);
  EXPECT_THROW(kernels::adam_step_cpu(&ptrs, 1, h, 1, CpuIsa::kAvx512), std::exception);
}

TEST(CpuAdamKernel, RegisteredSelfTestPasses) {
  bool found = false;
  for (const auto& k : kernels::registered_kernels()) {
    if (k.name == "adam" && k.device == "cpu") {
      found = true;
      EXPECT_EQ(k.self_test(), "");
    }
  }
  EXPECT_TRUE(found) << "adam/cpu is not registered for `colossus check`";
}

// HybridAdam over 5 steps equals the reference kernel driven by hand with
// make_adam_hyper, for both weight-decay modes and without bias correction.
TEST(HybridAdam, FeedsTheKernelTorchOrderConstants) {
  for (bool adamw_mode : {true, false}) {
    for (bool bias_correction : {true, false}) {
      std::vector<at::Tensor> params = {at::randn({300}), at::randn({7, 11})};
      std::vector<Buffers> ref;
      for (auto& p : params) ref.push_back({p.clone(), {}, at::zeros_like(p), at::zeros_like(p)});
      HybridAdam opt(params, {.lr = 2e-3, .betas = {0.8, 0.9}, .eps = 1e-6, .weight_decay = 0.05,
                              .adamw_mode = adamw_mode, .bias_correction = bias_correction});
      for (int64_t step = 1; step <= 5; ++step) {
        const auto h = kernels::make_adam_hyper(2e-3, 0.8, 0.9, 1e-6, 0.05, adamw_mode, bias_correction, step);
        for (size_t i = 0; i < params.size(); ++i) {
          params[i].mutable_grad() = at::randn(params[i].sizes());
          ref[i].g = params[i].grad().clone();
          auto ptrs = ref[i].ptrs();
          kernels::adam_step_reference(ptrs, h);
        }
        opt.step();
      }
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(at::equal(params[i], ref[i].p)) << "adamw_mode=" << adamw_mode << " bc=" << bias_correction;
      }
    }
  }
}

// Tensors the kernel cannot take (a transposed view, bf16, fp64) take the
// reference path: within float rounding of the fused result, and bf16 exactly
// as AdamW updates bf16 (in fp32, rounded back each step).
TEST(HybridAdam, FallsBackForNonContiguousAndLowPrecision) {
  at::manual_seed(11);
  auto base = at::randn({64, 48});
  at::Tensor fused = base.clone();
  at::Tensor strided = base.t().contiguous().t();  // same values, column-major
  ASSERT_FALSE(strided.is_contiguous());
  at::Tensor bf16 = base.to(at::kBFloat16);
  at::Tensor bf16_adamw = bf16.clone();
  at::Tensor fp64 = base.to(at::kDouble);
  HybridAdam opt(std::vector<at::Tensor>{fused, strided, bf16, fp64}, {.lr = 1e-2, .weight_decay = 0.1});
  AdamW reference(std::vector<at::Tensor>{bf16_adamw}, {.lr = 1e-2, .weight_decay = 0.1});
  for (int s = 0; s < 5; ++s) {
    auto g = at::randn({64, 48});
    fused.mutable_grad() = g.clone();
    strided.mutable_grad() = g.t().contiguous().t();
    bf16.mutable_grad() = g.to(at::kBFloat16);
    bf16_adamw.mutable_grad() = g.to(at::kBFloat16);
    fp64.mutable_grad() = g.to(at::kDouble);
    opt.step();
    reference.step();
  }
  EXPECT_LE(testing::max_rel_diff(strided, fused), 1e-6);
  EXPECT_LE(testing::max_rel_diff(fp64, fused), 1e-6);
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16, bf16_adamw));
  // bf16 spacing near |x| = 4 is 2^-6: a few roundings stay well inside 5e-2.
  EXPECT_LE(testing::max_rel_diff(bf16.to(at::kFloat), fused), 5e-2);
}

TEST(HybridAdam, CudaParamsEqualCpuParams) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  std::vector<at::Tensor> cpu = {at::randn({1000003}), at::randn({33, 17}), at::randn({1})};
  std::vector<at::Tensor> cuda;
  for (auto& p : cpu) cuda.push_back(p.cuda());
  HybridAdam on_cpu(cpu, {.lr = 1e-3, .weight_decay = 0.1});
  HybridAdam on_cuda(cuda, {.lr = 1e-3, .weight_decay = 0.1});
  for (int s = 0; s < 4; ++s) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      cpu[i].mutable_grad() = at::randn(cpu[i].sizes());
      cuda[i].mutable_grad() = cpu[i].grad().cuda();
    }
    on_cpu.step();
    on_cuda.step();
  }
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(at::equal(cuda[i].cpu(), cpu[i])) << "tensor " << i;
}

}  // namespace
}  // namespace colossus::optim
