// Ulysses (all_to_all) attention on sp = the world size against full
// single-process attention: forward and q/k/v grads, causal and not, padded
// lengths, GQA; heads not divisible by sp are refused with ConfigError.
#include "colossus/core/errors.h"
#include "colossus/parallel/sequence/layout.h"
#include "colossus/parallel/sequence/ring_attention.h"
#include "colossus/parallel/sequence/ulysses.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

using namespace colossus;
namespace ct = colossus::testing;
namespace ps = colossus::parallel::sequence;

namespace {

at::Tensor seeded_u(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kDouble).to(dtype);
}

void check_ulysses(bool causal, int64_t t, int64_t h, int64_t hkv, at::ScalarType dtype, double tol) {
  auto world = ct::world();
  const int64_t sp = world->size(), rank = world->rank(), b = 2, d = 8;
  const auto layout = ps::SequenceLayout::Contiguous;
  const std::string what = fmt::format("causal={} T={} H={} H_kv={} {}", causal, t, h, hkv, c10::toString(dtype));
  at::Tensor q = seeded_u({b, h, t, d}, 11, dtype), k = seeded_u({b, hkv, t, d}, 12, dtype),
             v = seeded_u({b, hkv, t, d}, 13, dtype), g = seeded_u({b, h, t, d}, 14, dtype);
  auto q_ref = q.to(at::kDouble).requires_grad_(true), k_ref = k.to(at::kDouble).requires_grad_(true),
       v_ref = v.to(at::kDouble).requires_grad_(true);
  at::Tensor out_ref = ps::reference_attention(q_ref, k_ref, v_ref, causal);
  (out_ref * g.to(at::kDouble)).sum().backward();

  auto shard = [&](const at::Tensor &x) { return ps::shard_sequence(x, 2, sp, rank, layout); };
  auto q_loc = shard(q).detach().requires_grad_(true), k_loc = shard(k).detach().requires_grad_(true),
       v_loc = shard(v).detach().requires_grad_(true);
  at::Tensor out_loc = ps::ulysses_attention(q_loc, k_loc, v_loc, *world, {.causal = causal, .seq_len = t});
  ASSERT_EQ(out_loc.sizes(), q_loc.sizes()) << what;
  (out_loc * shard(g)).sum().backward();
  auto unshard = [&](const at::Tensor &x) { return ps::unshard_sequence(x, 2, t, *world, layout).to(at::kDouble); };
  EXPECT_LE(ct::max_rel_diff(unshard(out_loc), out_ref), tol) << "out " << what;
  EXPECT_LE(ct::max_rel_diff(unshard(q_loc.grad()), q_ref.grad()), tol) << "dq " << what;
  EXPECT_LE(ct::max_rel_diff(unshard(k_loc.grad()), k_ref.grad()), tol) << "dk " << what;
  EXPECT_LE(ct::max_rel_diff(unshard(v_loc.grad()), v_ref.grad()), tol) << "dv " << what;
}

}  // namespace

TEST(UlyssesAttention, AllToAllRoundTrip) {
  auto world = ct::world();
  const int64_t sp = world->size();
  at::Tensor x = seeded_u({2, 4 * sp, 3, 5}, 21, at::kDouble);
  at::Tensor heads = ps::sequence_to_head(x, *world);
  EXPECT_EQ(heads.sizes(), (std::vector<int64_t>{2, 4, 3 * sp, 5}));
  EXPECT_TRUE(ps::head_to_sequence(heads, *world).equal(x));
}

TEST(UlyssesAttention, MatchesFullAttention) {
  const int64_t sp = ct::world()->size();
  for (bool causal : {true, false})
    for (int64_t t : {16, 13}) {
      check_ulysses(causal, t, 2 * sp, 2 * sp, at::kDouble, 1e-10);
      check_ulysses(causal, t, 4 * sp, sp, at::kDouble, 1e-10);  // GQA
    }
  check_ulysses(true, 21, 2 * sp, sp, at::kFloat, 1e-5);
}

TEST(UlyssesAttention, RefusesHeadsNotDivisibleBySp) {
  auto world = ct::world();
  const int64_t sp = world->size();
  if (sp == 1) GTEST_SKIP() << "every head count divides by sp=1";
  at::Tensor q = at::zeros({1, sp + 1, 4, 4});
  try {
    ps::ulysses_attention(q, q, q, *world);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError &e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("not divisible by sp={}", sp)), std::string::npos) << e.what();
  }
}
