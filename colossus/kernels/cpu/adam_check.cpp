// Self-test of the CPU Adam kernel for `colossus check`: every ISA this CPU
// supports, single- and multi-threaded, against the scalar reference, bit for
// bit, on sizes that exercise the vector tails and the thread split.
#include "colossus/kernels/adam.h"
#include "colossus/kernels/registry.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace colossus::kernels {

namespace {

struct Buffers {
  std::vector<float> p, g, m, v;
  AdamTensorPtrs ptrs() { return {p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(p.size())}; }
};

Buffers random_buffers(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> positive(0.0f, 1e-3f);
  Buffers b;
  for (int64_t i = 0; i < n; ++i) {
    b.p.push_back(normal(rng));
    b.g.push_back(normal(rng) * 1e-2f);
    b.m.push_back(normal(rng) * 1e-3f);
    b.v.push_back(positive(rng));
  }
  return b;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string check_adam_cpu() {
  std::mt19937 rng(1234);
  const std::vector<int64_t> sizes = {1, 7, 15, 16, 17, 1000, 100003, 300001};
  for (bool decoupled : {true, false}) {
    for (double wd : {0.0, 0.1}) {
      const AdamHyper h = make_adam_hyper(1e-3, 0.9, 0.999, 1e-8, wd, decoupled, true, 3);
      std::vector<Buffers> inputs;
      for (int64_t n : sizes) inputs.push_back(random_buffers(n, rng));
      std::vector<Buffers> expected = inputs;
      for (auto& b : expected) adam_step_reference(b.ptrs(), h);
      for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
        if (!cpu_supports(isa)) continue;
        for (int threads : {1, 2, 3}) {
          std::vector<Buffers> got = inputs;
          std::vector<AdamTensorPtrs> table;
          for (auto& b : got) table.push_back(b.ptrs());
          adam_step_cpu(table.data(), static_cast<int64_t>(table.size()), h, threads, isa);
          for (size_t i = 0; i < got.size(); ++i) {
            if (!same_bits(got[i].p, expected[i].p) || !same_bits(got[i].m, expected[i].m) ||
                !same_bits(got[i].v, expected[i].v)) {
              return fmt::format("{} with {} threads (decoupled={}, weight_decay={}) differs from the reference on "
                                 "a tensor of {} elements",
                                 isa_name(isa), threads, decoupled, wd, sizes[i]);
            }
          }
        }
      }
    }
  }
  return {};
}

// The mixed kernel (bf16 gradient in, bf16 parameter out over it): the fp32
// results against adam_step_reference on float(grad) * scale, the bf16 output
// against the scalar body, for every ISA and thread count.
std::string check_adam_mixed_cpu() {
  std::mt19937 rng(4321);
  const std::vector<int64_t> sizes = {1, 15, 33, 100003, 300001};
  const float grad_scale = 0.75f;
  for (bool decoupled : {true, false}) {
    const AdamHyper h = make_adam_hyper(1e-3, 0.9, 0.999, 1e-8, 0.1, decoupled, true, 2);
    std::vector<Buffers> inputs;
    std::vector<std::vector<uint16_t>> grads;
    for (int64_t n : sizes) {
      inputs.push_back(random_buffers(n, rng));
      std::vector<uint16_t> g(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &inputs.back().g[static_cast<size_t>(i)], sizeof bits);
        g[static_cast<size_t>(i)] = static_cast<uint16_t>(bits >> 16);
        bits &= 0xFFFF0000u;
        std::memcpy(&inputs.back().g[static_cast<size_t>(i)], &bits, sizeof bits);
        inputs.back().g[static_cast<size_t>(i)] *= grad_scale;
      }
      grads.push_back(std::move(g));
    }
    std::vector<Buffers> expected = inputs;
    std::vector<std::vector<uint16_t>> expected_low = grads;
    for (size_t i = 0; i < expected.size(); ++i) {
      adam_step_reference(expected[i].ptrs(), h);
      Buffers scalar = inputs[i];
      adam_step_mixed_reference({scalar.p.data(), grads[i].data(), scalar.m.data(), scalar.v.data(),
                                 expected_low[i].data(), static_cast<int64_t>(sizes[i])},
                                h, grad_scale);
    }
    for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (!cpu_supports(isa)) continue;
      for (int threads : {1, 3}) {
        std::vector<Buffers> got = inputs;
        std::vector<std::vector<uint16_t>> io = grads;  // the gradient, then the bf16 parameter over it
        std::vector<AdamMixedPtrs> table;
        for (size_t i = 0; i < got.size(); ++i)
          table.push_back({got[i].p.data(), io[i].data(), got[i].m.data(), got[i].v.data(), io[i].data(),
                           static_cast<int64_t>(sizes[i])});
        adam_step_mixed_cpu(table.data(), static_cast<int64_t>(table.size()), h, grad_scale, threads, isa);
        for (size_t i = 0; i < got.size(); ++i) {
          if (!same_bits(got[i].p, expected[i].p) || !same_bits(got[i].m, expected[i].m) ||
              !same_bits(got[i].v, expected[i].v) || io[i] != expected_low[i]) {
            return fmt::format("mixed (bf16) step, {} with {} threads (decoupled={}) differs from the reference on "
                               "a tensor of {} elements",
                               isa_name(isa), threads, decoupled, sizes[i]);
          }
        }
      }
    }
  }
  return {};
}

// The mixed kernel from an fp32 gradient (Gemini's host accumulator): fp32
// results against adam_step_reference on grad * scale, the bf16 parameter
// against the scalar body, for every ISA and thread count.
std::string check_adam_mixed_fp32_grad_cpu() {
  std::mt19937 rng(8765);
  const std::vector<int64_t> sizes = {1, 15, 33, 100003, 300001};
  const float grad_scale = 0.75f;
  for (bool decoupled : {true, false}) {
    const AdamHyper h = make_adam_hyper(1e-3, 0.9, 0.999, 1e-8, 0.1, decoupled, true, 2);
    std::vector<Buffers> inputs, expected;
    std::vector<std::vector<uint16_t>> expected_low;
    for (int64_t n : sizes) {
      inputs.push_back(random_buffers(n, rng));
      Buffers scaled = inputs.back();
      for (float& g : scaled.g) g *= grad_scale;
      adam_step_reference(scaled.ptrs(), h);
      expected.push_back(std::move(scaled));
      Buffers scalar = inputs.back();
      std::vector<uint16_t> low(static_cast<size_t>(n));
      adam_step_mixed_reference(
          AdamMixedFp32GradPtrs{scalar.p.data(), scalar.g.data(), scalar.m.data(), scalar.v.data(), low.data(), n}, h,
          grad_scale);
      expected_low.push_back(std::move(low));
    }
    for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (!cpu_supports(isa)) continue;
      for (int threads : {1, 3}) {
        std::vector<Buffers> got = inputs;
        std::vector<std::vector<uint16_t>> low(got.size());
        std::vector<AdamMixedFp32GradPtrs> table;
        for (size_t i = 0; i < got.size(); ++i) {
          low[i].assign(got[i].p.size(), 0);
          table.push_back({got[i].p.data(), got[i].g.data(), got[i].m.data(), got[i].v.data(), low[i].data(),
                           static_cast<int64_t>(sizes[i])});
        }
        adam_step_mixed_cpu(table.data(), static_cast<int64_t>(table.size()), h, grad_scale, threads, isa);
        for (size_t i = 0; i < got.size(); ++i) {
          if (!same_bits(got[i].p, expected[i].p) || !same_bits(got[i].m, expected[i].m) ||
              !same_bits(got[i].v, expected[i].v) || low[i] != expected_low[i]) {
            return fmt::format("mixed (fp32 gradient) step, {} with {} threads (decoupled={}) differs from the "
                               "reference on a tensor of {} elements",
                               isa_name(isa), threads, decoupled, sizes[i]);
          }
        }
      }
    }
  }
  return {};
}

const bool registered = [] {
  register_kernel({"adam", "cpu", check_adam_cpu});
  register_kernel({"adam_mixed", "cpu", check_adam_mixed_cpu});
  register_kernel({"adam_mixed_fp32_grad", "cpu", check_adam_mixed_fp32_grad_cpu});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels

// Referenced by a linker --undefined option on colossus_kernels (see its
// CMakeLists.txt), so every program that links the kernels library keeps this
// object and its registration, though nothing calls into it.
extern "C" {
int colossus_kernels_adam_check_anchor = 1;
}
