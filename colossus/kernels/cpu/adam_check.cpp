// Self-test of the CPU Adam kernel for `colossus check`: every ISA this CPU
// supports, single- and multi-threaded, against the scalar reference, bit for
// bit, on sizes that exercise the vector tails and the thread split.
#include "colossus/kernels/adam.h"
#include "colossus/kernels/registry.h"

#include <fmt/format.h>

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

const bool registered = [] {
  register_kernel({"adam", "cpu", check_adam_cpu});
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
