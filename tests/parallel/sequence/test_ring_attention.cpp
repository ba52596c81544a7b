// Ring attention on sp = the world size against full single-process attention:
// forward and q/k/v grads, causal and non-causal, zig-zag and contiguous
// layouts, lengths not divisible by 2*sp (padded), GQA, fp64 and fp32,
// two-level rings (inner_ring_size); the single-process blockwise path the
// benchmark times; the layout helpers round-trip; bad configurations are
// refused with ConfigError.
#include "colossus/core/errors.h"
#include "colossus/parallel/sequence/layout.h"
#include "colossus/parallel/sequence/ring_attention.h"
#include "colossus/parallel/sequence/ring_blocks.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <tuple>

using namespace colossus;
namespace ct = colossus::testing;
namespace ps = colossus::parallel::sequence;

namespace {

at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kDouble).to(dtype);
}

struct Case {
  bool causal;
  int64_t seq_len, heads, kv_heads;
  at::ScalarType dtype;
  ps::SequenceLayout layout;
  double tol;
  int64_t inner_ring_size = 0;
  ps::BlockKernel kernel = ps::BlockKernel::Fused;
};

constexpr ps::BlockKernel kKernels[] = {ps::BlockKernel::Fused, ps::BlockKernel::Math};

std::string describe(const Case &c) {
  return fmt::format("causal={} T={} H={} H_kv={} dtype={} layout={} inner_ring_size={} kernel={}", c.causal,
                     c.seq_len, c.heads, c.kv_heads, c10::toString(c.dtype),
                     c.layout == ps::SequenceLayout::ZigZag ? "zigzag" : "contiguous", c.inner_ring_size,
                     c.kernel == ps::BlockKernel::Fused ? "fused" : "math");
}

// Runs one case on the world group and compares output and grads.
void check_case(const Case &c) {
  auto world = ct::world();
  const int64_t sp = world->size(), rank = world->rank(), b = 2, d = 8;
  const std::string what = describe(c);
  at::Tensor q = seeded({b, c.heads, c.seq_len, d}, 1, c.dtype);
  at::Tensor k = seeded({b, c.kv_heads, c.seq_len, d}, 2, c.dtype);
  at::Tensor v = seeded({b, c.kv_heads, c.seq_len, d}, 3, c.dtype);
  at::Tensor g = seeded({b, c.heads, c.seq_len, d}, 4, c.dtype);

  // Reference in fp64 on the full sequence.
  auto q_ref = q.to(at::kDouble).requires_grad_(true), k_ref = k.to(at::kDouble).requires_grad_(true),
       v_ref = v.to(at::kDouble).requires_grad_(true);
  at::Tensor out_ref = ps::reference_attention(q_ref, k_ref, v_ref, c.causal);
  (out_ref * g.to(at::kDouble)).sum().backward();

  auto shard = [&](const at::Tensor &x) { return ps::shard_sequence(x, 2, sp, rank, c.layout); };
  auto q_loc = shard(q).detach().requires_grad_(true), k_loc = shard(k).detach().requires_grad_(true),
       v_loc = shard(v).detach().requires_grad_(true);
  at::Tensor out_loc =
      ps::ring_attention(q_loc, k_loc, v_loc, *world,
                         {.causal = c.causal,
                          .seq_len = c.seq_len,
                          .layout = c.layout,
                          .inner_ring_size = c.inner_ring_size,
                          .block_kernel = c.kernel});
  ASSERT_EQ(out_loc.sizes(), q_loc.sizes()) << what;
  ASSERT_EQ(out_loc.scalar_type(), c.dtype) << what;
  (out_loc * shard(g)).sum().backward();

  auto unshard = [&](const at::Tensor &x) {
    return ps::unshard_sequence(x, 2, c.seq_len, *world, c.layout).to(at::kDouble);
  };
  EXPECT_LE(ct::max_rel_diff(unshard(out_loc), out_ref), c.tol) << "out " << what;
  EXPECT_LE(ct::max_rel_diff(unshard(q_loc.grad()), q_ref.grad()), c.tol) << "dq " << what;
  EXPECT_LE(ct::max_rel_diff(unshard(k_loc.grad()), k_ref.grad()), c.tol) << "dk " << what;
  EXPECT_LE(ct::max_rel_diff(unshard(v_loc.grad()), v_ref.grad()), c.tol) << "dv " << what;
}

}  // namespace

TEST(SequenceLayout, ShardUnshardRoundTrip) {
  auto world = ct::world();
  const int64_t sp = world->size(), rank = world->rank();
  for (auto layout : {ps::SequenceLayout::ZigZag, ps::SequenceLayout::Contiguous}) {
    for (int64_t t : {16, 13, 1}) {
      at::Tensor x = at::arange(2 * t * 3, at::kFloat).view({2, t, 3});
      at::Tensor local = ps::shard_sequence(x, 1, sp, rank, layout);
      const int64_t padded = ps::padded_length(t, sp, layout);
      ASSERT_EQ(local.size(1), padded / sp);
      // Every local token sits at the position local_positions says.
      auto pos = ps::local_positions(local.size(1), sp, rank, layout);
      for (size_t i = 0; i < pos.size(); ++i) {
        if (pos[i] < t)
          EXPECT_TRUE(local.select(1, i).equal(x.select(1, pos[i])));
        else
          EXPECT_EQ(local.select(1, i).abs().sum().item<float>(), 0.0f);
      }
      EXPECT_TRUE(ps::unshard_sequence(local, 1, t, *world, layout).equal(x));
    }
  }
  EXPECT_EQ(ps::padded_length(13, 2, ps::SequenceLayout::ZigZag), 16);
  EXPECT_EQ(ps::padded_length(13, 4, ps::SequenceLayout::Contiguous), 16);
  EXPECT_EQ(ps::padded_length(16, 4, ps::SequenceLayout::ZigZag), 16);
}

TEST(RingAttention, ReferenceMatchesSdpa) {
  at::Tensor q = seeded({2, 4, 11, 8}, 1, at::kDouble), k = seeded({2, 4, 11, 8}, 2, at::kDouble),
             v = seeded({2, 4, 11, 8}, 3, at::kDouble);
  for (bool causal : {false, true}) {
    at::Tensor want = at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
    EXPECT_LE(ct::max_rel_diff(ps::reference_attention(q, k, v, causal), want), 1e-12);
  }
}

TEST(RingAttention, MatchesFullAttentionFp64) {
  for (auto kernel : kKernels)
    for (bool causal : {true, false})
      for (int64_t t : {16, 13, 37})
        for (auto [h, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {6, 1}})
          check_case({causal, t, h, hkv, at::kDouble, ps::SequenceLayout::ZigZag, 1e-10, 0, kernel});
}

TEST(RingAttention, MatchesFullAttentionContiguousLayout) {
  for (auto kernel : kKernels)
    for (bool causal : {true, false})
      for (int64_t t : {16, 13})
        check_case({causal, t, 4, 2, at::kDouble, ps::SequenceLayout::Contiguous, 1e-10, 0, kernel});
}

TEST(RingAttention, MatchesFullAttentionFp32) {
  for (auto kernel : kKernels)
    for (bool causal : {true, false})
      check_case({causal, 29, 4, 2, at::kFloat, ps::SequenceLayout::ZigZag, 1e-5, 0, kernel});
}

TEST(RingAttention, Bf16RunsInFloatAccumulation) {
  // bf16 inputs: merged in float, so only the rounding of inputs, of each
  // fused block's output and of the output remains.
  for (auto kernel : kKernels) check_case({true, 24, 4, 2, at::kBFloat16, ps::SequenceLayout::ZigZag, 2e-2, 0, kernel});
}

// Which blocks the fused kernel takes: with zig-zag causal shards, a rank's
// own block (the causal lower triangle) and every other block (unmasked
// boxes); not a block holding padding or packed documents (matmuls there).
TEST(RingAttention, FusedKernelTakesOwnAndUnmaskedBlocks) {
  namespace blk = ps::blocks;
  const int64_t sp = 2, local = 8, total = sp * local;
  auto pos = [&](int64_t rank) { return ps::local_positions(local, sp, rank, ps::SequenceLayout::ZigZag); };
  const at::Tensor q = at::zeros({1, 2, local, 8});
  const blk::BlockMath fused{1, 0.5, ps::BlockKernel::Fused}, math{1, 0.5, ps::BlockKernel::Math};
  const blk::BlockPlan own = blk::plan_block(pos(0), pos(0), true, total, q.options());
  EXPECT_TRUE(own.causal_square && own.mask.defined());
  EXPECT_TRUE(fused.fused(q, own));
  EXPECT_FALSE(math.fused(q, own));
  const blk::BlockPlan earlier = blk::plan_block(pos(1), pos(0), true, total, q.options());
  EXPECT_FALSE(earlier.mask.defined());
  EXPECT_TRUE(fused.fused(q, earlier));
  const blk::BlockPlan padded = blk::plan_block(pos(0), pos(0), true, total - 3, q.options());
  EXPECT_FALSE(padded.causal_square);
  EXPECT_FALSE(fused.fused(q, padded));
  const blk::BlockPlan packed =
      blk::plan_block(pos(1), pos(0), true, total, q.options(), at::zeros({1, total}, at::kLong));
  EXPECT_FALSE(fused.fused(q, packed));
  // A causal box whose queries are not the keys' own positions is no triangle.
  const std::vector<int64_t> shifted{1, 2, 3, 4};
  EXPECT_FALSE(blk::plan_block(shifted, {0, 1, 2, 3}, true, total, q.options()).causal_square);
}

// Two-level rings: inner rings of every size dividing sp (sp = 4: inner rings
// of 2 joined by an outer ring of 2; 1: the outer ring alone) give the
// single ring's result, forward and grads.
TEST(RingAttention, TwoLevelRingsMatchFullAttention) {
  const int64_t sp = ct::world()->size();
  for (int64_t inner = 1; inner <= sp; ++inner) {
    if (sp % inner != 0) continue;
    for (auto kernel : kKernels) {
      for (bool causal : {true, false})
        for (int64_t t : {16, 13})
          check_case({causal, t, 4, 2, at::kDouble, ps::SequenceLayout::ZigZag, 1e-10, inner, kernel});
      check_case({true, 13, 4, 2, at::kDouble, ps::SequenceLayout::Contiguous, 1e-10, inner, kernel});
    }
  }
}

// The benchmark's single-process blockwise path (every simulated rank's
// blocks in ring order) equals full attention, forward and grads.
TEST(RingAttention, BlockwisePathMatchesFullAttention) {
  for (int64_t sp : {1, 2, 3, 4}) {
    for (auto layout : {ps::SequenceLayout::ZigZag, ps::SequenceLayout::Contiguous}) {
      for (const auto &row : {std::tuple{true, ps::BlockKernel::Fused, 24}, {false, ps::BlockKernel::Fused, 24},
                              {true, ps::BlockKernel::Fused, 21}, {true, ps::BlockKernel::Math, 21},
                              {false, ps::BlockKernel::Math, 21}}) {
        const bool causal = std::get<0>(row);
        const ps::BlockKernel kernel = std::get<1>(row);
        const int64_t seq_len = std::get<2>(row);
        const int64_t padded = ps::padded_length(seq_len, sp, layout);
        at::Tensor q = seeded({2, 4, padded, 8}, 1, at::kDouble).requires_grad_(true);
        at::Tensor k = seeded({2, 2, padded, 8}, 2, at::kDouble).requires_grad_(true);
        at::Tensor v = seeded({2, 2, padded, 8}, 3, at::kDouble).requires_grad_(true);
        at::Tensor g = seeded({2, 4, padded, 8}, 4, at::kDouble).narrow(2, 0, seq_len);
        const std::string what = fmt::format("sp={} zigzag={} causal={} T={} fused={}", sp,
                                             layout == ps::SequenceLayout::ZigZag, causal, seq_len,
                                             kernel == ps::BlockKernel::Fused);
        auto run = [&](bool blockwise) {
          for (auto *x : {&q, &k, &v}) x->mutable_grad() = at::Tensor();
          at::Tensor out = blockwise ? ps::blockwise_ring_attention(q, k, v, sp,
                                                                    {.causal = causal,
                                                                     .seq_len = seq_len,
                                                                     .layout = layout,
                                                                     .block_kernel = kernel})
                                     : ps::reference_attention(q, k, v, causal, 0.0, seq_len);
          out = out.narrow(2, 0, seq_len);
          (out * g).sum().backward();
          return std::vector<at::Tensor>{out.detach(), q.grad().narrow(2, 0, seq_len), k.grad().narrow(2, 0, seq_len),
                                         v.grad().narrow(2, 0, seq_len)};
        };
        auto want = run(false), got = run(true);
        for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(ct::max_rel_diff(got[i], want[i]), 1e-10) << i << " " << what;
      }
    }
  }
  at::Tensor x = at::zeros({1, 2, 6, 4});
  EXPECT_THROW(ps::blockwise_ring_attention(x, x, x, 2), ConfigError);  // 6 tokens are not 4 zig-zag chunks
}

// Packed and padded rows: with document ids, the blockwise ring keeps each
// query inside its own document (a negative id, padding, sees only itself),
// as a dense masked reference does, forward and grads, for every sp and
// layout, GQA, a length that needs ring padding.
TEST(RingAttention, DocumentsKeepPackedRowsApart) {
  const int64_t seq_len = 21, heads = 4, kv_heads = 2, d = 8;
  for (int64_t sp : {1, 2, 3}) {
    for (auto layout : {ps::SequenceLayout::ZigZag, ps::SequenceLayout::Contiguous}) {
      const int64_t padded = ps::padded_length(seq_len, sp, layout);
      std::vector<int64_t> ids(static_cast<size_t>(2 * padded), -1);
      for (int64_t t = 0; t < seq_len - 2; ++t) {  // the last two real tokens of each row are padding
        ids[static_cast<size_t>(t)] = t < 7 ? 0 : t < 16 ? 1 : 2;
        ids[static_cast<size_t>(padded + t)] = 0;
      }
      at::Tensor docs = at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({2, padded});
      at::Tensor q = seeded({2, heads, padded, d}, 1, at::kDouble).requires_grad_(true);
      at::Tensor k = seeded({2, kv_heads, padded, d}, 2, at::kDouble).requires_grad_(true);
      at::Tensor v = seeded({2, kv_heads, padded, d}, 3, at::kDouble).requires_grad_(true);
      at::Tensor g = seeded({2, heads, padded, d}, 4, at::kDouble).narrow(2, 0, seq_len);
      const std::string what = fmt::format("sp={} zigzag={}", sp, layout == ps::SequenceLayout::ZigZag);
      auto run = [&](bool blockwise) {
        for (auto *x : {&q, &k, &v}) x->mutable_grad() = at::Tensor();
        at::Tensor out;
        if (blockwise) {
          out = ps::blockwise_ring_attention(q, k, v, sp,
                                             {.causal = true, .seq_len = seq_len, .layout = layout, .documents = docs});
        } else {
          const at::Tensor pos = at::arange(padded);
          const at::Tensor causal = pos.unsqueeze(1).ge(pos.unsqueeze(0)).logical_and(pos.lt(seq_len).unsqueeze(0));
          const at::Tensor same = docs.unsqueeze(2).eq(docs.unsqueeze(1)).logical_and(docs.ge(0).unsqueeze(1));
          const at::Tensor allowed = same.logical_and(causal).logical_or(at::eye(padded, at::kBool)).unsqueeze(1);
          at::Tensor kx = k.repeat_interleave(heads / kv_heads, 1), vx = v.repeat_interleave(heads / kv_heads, 1);
          at::Tensor s = at::matmul(q, kx.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
          out = at::matmul(at::softmax(s.masked_fill(allowed.logical_not(), -INFINITY), -1), vx);
        }
        out = out.narrow(2, 0, seq_len);
        (out * g).sum().backward();
        return std::vector<at::Tensor>{out.detach(), q.grad().narrow(2, 0, seq_len), k.grad().narrow(2, 0, seq_len),
                                       v.grad().narrow(2, 0, seq_len)};
      };
      auto want = run(false), got = run(true);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(ct::max_rel_diff(got[i], want[i]), 1e-10) << i << " " << what;
    }
  }
}

// On a CUDA machine (scripts/device_ring_attention.sh runs this binary on one
// rank): ring attention over the one-rank world and its blockwise path with
// sp 2 and 4 simulated, on CUDA tensors in fp32 and bf16, equal the fp64 CPU
// reference, forward and q/k/v grads, causal with a padded length. Skipped
// without a GPU; MPI carries host tensors only, so one rank.
TEST(RingAttention, RunsOnCudaTensors) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto world = ct::world();
  if (world->size() != 1) GTEST_SKIP() << "CUDA tensors on one rank only";
  const int64_t t = 64;
  // kv heads 2 (GQA: cuDNN's blocks on k and v repeated to q's heads, dk and
  // dv summed back; the fp32 row takes the matmul path) and 4 (as many as q).
  for (const auto &row : {std::tuple{at::kFloat, int64_t{61}, int64_t{2}}, {at::kBFloat16, int64_t{61}, int64_t{2}},
                          {at::kBFloat16, t, int64_t{2}}, {at::kBFloat16, int64_t{61}, int64_t{4}},
                          {at::kBFloat16, t, int64_t{4}}}) {
    const at::ScalarType dtype = std::get<0>(row);
    const int64_t seq_len = std::get<1>(row), kv_heads = std::get<2>(row);
    const double tol = dtype == at::kFloat ? 1e-4 : 3e-2;
    at::Tensor q = seeded({2, 4, t, 16}, 1, dtype), k = seeded({2, kv_heads, t, 16}, 2, dtype),
               v = seeded({2, kv_heads, t, 16}, 3, dtype), g = seeded({2, 4, t, 16}, 4, dtype).narrow(2, 0, seq_len);
    auto leaf = [](const at::Tensor &x, c10::Device device, at::ScalarType type) {
      return x.to(device, type).detach().requires_grad_(true);
    };
    auto run = [&](c10::Device device, at::ScalarType type, const std::function<at::Tensor(
                                                                 const at::Tensor &, const at::Tensor &, const at::Tensor &)> &attend) {
      at::Tensor ql = leaf(q, device, type), kl = leaf(k, device, type), vl = leaf(v, device, type);
      at::Tensor out = attend(ql, kl, vl).narrow(2, 0, seq_len);
      EXPECT_EQ(out.device().type(), device.type());
      (out * g.to(device, type)).sum().backward();
      return std::vector<at::Tensor>{out.detach().cpu().to(at::kDouble), ql.grad().cpu().to(at::kDouble),
                                     kl.grad().cpu().to(at::kDouble), vl.grad().cpu().to(at::kDouble)};
    };
    auto want = run(c10::kCPU, at::kDouble, [&](const at::Tensor &a, const at::Tensor &b, const at::Tensor &c) {
      return ps::reference_attention(a, b, c, true, 0.0, seq_len);
    });
    const c10::Device cuda(c10::kCUDA, 0);
    std::vector<std::pair<std::string, std::vector<at::Tensor>>> paths;
    paths.emplace_back("ring_attention", run(cuda, dtype, [&](const at::Tensor &a, const at::Tensor &b, const at::Tensor &c) {
                         return ps::ring_attention(a, b, c, *world, {.seq_len = seq_len});
                       }));
    for (int64_t sp : {2, 4}) {
      paths.emplace_back(fmt::format("blockwise sp={}", sp),
                         run(cuda, dtype, [&](const at::Tensor &a, const at::Tensor &b, const at::Tensor &c) {
                           return ps::blockwise_ring_attention(a, b, c, sp, {.seq_len = seq_len});
                         }));
    }
    for (const auto &[name, got] : paths)
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_LE(ct::max_rel_diff(got[i], want[i]), tol) << name << " " << c10::toString(dtype) << " tensor " << i;
  }
}

TEST(RingAttention, RefusesBadConfigs) {
  auto world = ct::world();
  const int64_t sp = world->size();
  at::Tensor odd = at::zeros({1, 2, 3, 4});
  EXPECT_THROW(ps::ring_attention(odd, odd, odd, *world),
               ConfigError);  // zig-zag needs 2 chunks per rank
  try {
    ps::ring_attention(odd, odd, odd, *world);
  } catch (const ConfigError &e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("sp={}", sp)), std::string::npos) << e.what();
  }
  at::Tensor q = at::zeros({1, 3, 4, 4}), kv = at::zeros({1, 2, 4, 4});
  EXPECT_THROW(ps::ring_attention(q, kv, kv, *world),
               ConfigError);  // 3 heads over 2 kv heads
  at::Tensor x = at::zeros({1, 2, 4, 4});
  EXPECT_THROW(ps::ring_attention(x, x, x, *world, {.inner_ring_size = sp + 1}), ConfigError);
  EXPECT_THROW(ps::ring_attention(x, x, x, *world, {.inner_ring_size = -1}), ConfigError);
  if (sp == 4) {
    try {
      ps::ring_attention(x, x, x, *world, {.inner_ring_size = 3});
      ADD_FAILURE() << "inner_ring_size 3 with sp 4 must be refused";
    } catch (const ConfigError &e) {
      EXPECT_NE(std::string(e.what()).find("does not divide the 4 sp ranks"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ps::ring_attention(x, x, x, *world, {.seq_len = 4 * sp + 1}), ConfigError);
}

int main(int argc, char **argv) { return ct::run_all_tests(argc, argv); }
