// Every collective and point-to-point op of ProcessGroup over the MPI backend,
// run by CTest on 1, 2, 3 and 4 ranks, in fp32, fp16, bf16 (and fp64/int64).
// Each rank fills its input from its rank, so the expected result is known in
// closed form on every rank.
#include "colossus/cluster/fp8_collectives.h"
#include "colossus/cluster/process_group.h"
#include "colossus/core/errors.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>

using colossus::cluster::ReduceOp;
using colossus::testing::world;

namespace {

class Collectives : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  at::TensorOptions opts() const { return at::TensorOptions().dtype(GetParam()); }
  // 16-bit types hold small integers exactly, so all comparisons are exact.
  void expect_equal(const at::Tensor& got, const at::Tensor& want) {
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(at::equal(got.to(at::kDouble), want.to(at::kDouble))) << "got " << got << "\nwant " << want;
  }
};

std::string dtype_name(const ::testing::TestParamInfo<at::ScalarType>& info) {
  return std::string(c10::toString(info.param));
}

}  // namespace

TEST_P(Collectives, AllReduceOps) {
  auto pg = world();
  int n = pg->size(), r = pg->rank();
  auto base = at::arange(1, 8, opts());  // 1..7
  auto t = base * (r + 1);
  pg->all_reduce(t, ReduceOp::Sum).wait();
  expect_equal(t, base * (n * (n + 1) / 2));

  t = base + r;
  pg->all_reduce(t, ReduceOp::Max).wait();
  expect_equal(t, base + (n - 1));

  t = base + r;
  pg->all_reduce(t, ReduceOp::Min).wait();
  expect_equal(t, base);

  t = at::full({5}, 2, opts());
  pg->all_reduce(t, ReduceOp::Product).wait();
  expect_equal(t, at::full({5}, std::pow(2.0, n), opts()));

  t = at::full({3, 2}, 2.0 * r, opts());
  pg->all_reduce(t, ReduceOp::Avg).wait();
  expect_equal(t, at::full({3, 2}, static_cast<double>(n - 1), opts()));
}

TEST_P(Collectives, ReduceScatter) {
  auto pg = world();
  int n = pg->size(), r = pg->rank();
  const int64_t chunk = 3;
  // input[i] = i + r, so the sum over ranks is n*i + n(n-1)/2.
  auto input = at::arange(n * chunk, opts()) + r;
  auto output = at::full({chunk}, -1, opts());
  pg->reduce_scatter(output, input).wait();
  auto idx = at::arange(r * chunk, (r + 1) * chunk, at::kDouble);
  expect_equal(output, (idx * n + n * (n - 1) / 2).to(GetParam()));
}

TEST_P(Collectives, AllGather) {
  auto pg = world();
  int n = pg->size(), r = pg->rank();
  auto input = at::full({2, 2}, r + 1, opts());
  auto flat = at::zeros({n * 4}, opts());
  pg->all_gather_into(flat, input).wait();
  for (int k = 0; k < n; ++k) expect_equal(flat.narrow(0, k * 4, 4), at::full({4}, k + 1, opts()));

  std::vector<at::Tensor> outputs;
  for (int k = 0; k < n; ++k) outputs.push_back(at::zeros({2, 2}, opts()));
  pg->all_gather(outputs, input).wait();
  for (int k = 0; k < n; ++k) expect_equal(outputs[k], at::full({2, 2}, k + 1, opts()));
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  auto pg = world();
  for (int root = 0; root < pg->size(); ++root) {
    auto t = pg->rank() == root ? at::arange(6, opts()) + root : at::zeros({6}, opts());
    pg->broadcast(t, root).wait();
    expect_equal(t, at::arange(6, opts()) + root);
  }
}

TEST_P(Collectives, AllToAllEvenAndUneven) {
  auto pg = world();
  int n = pg->size(), r = pg->rank();
  // Even: row k of rank r's input holds 100*r + k and goes to rank k.
  auto input = (at::arange(n, at::kDouble) + 100.0 * r).to(GetParam()).view({n, 1}).repeat({1, 2});
  auto output = at::zeros({n, 2}, opts());
  pg->all_to_all(output, input).wait();
  for (int k = 0; k < n; ++k) expect_equal(output[k], at::full({2}, 100.0 * k + r, opts()));

  // Uneven: rank r sends (k+1) rows to rank k, each row = r; so rank r
  // receives (r+1) rows from every rank k, valued k.
  std::vector<int64_t> in_splits, out_splits;
  int64_t in_rows = 0;
  for (int k = 0; k < n; ++k) {
    in_splits.push_back(k + 1);
    in_rows += k + 1;
    out_splits.push_back(r + 1);
  }
  auto uneven_in = at::full({in_rows, 3}, r, opts());
  auto uneven_out = at::full({n * (r + 1), 3}, -1, opts());
  pg->all_to_all(uneven_out, uneven_in, out_splits, in_splits).wait();
  for (int k = 0; k < n; ++k) expect_equal(uneven_out.narrow(0, k * (r + 1), r + 1), at::full({r + 1, 3}, k, opts()));
}

TEST_P(Collectives, SendRecvRingBothDirections) {
  auto pg = world();
  int n = pg->size(), r = pg->rank();
  if (n == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  // Every rank sends before it receives: must not deadlock.
  auto to_next = at::full({1000}, r, opts());
  auto from_prev = at::zeros({1000}, opts());
  auto send = pg->send(to_next, (r + 1) % n, /*tag=*/7);
  auto recv = pg->recv(from_prev, (r + n - 1) % n, /*tag=*/7);
  send.wait();
  recv.wait();
  expect_equal(from_prev, at::full({1000}, (r + n - 1) % n, opts()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives,
                         ::testing::Values(at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kLong),
                         dtype_name);

// FP8 on the wire: every rank gets the same values, within e4m3's precision
// of the exact all-reduce (3 mantissa bits: 2^-4 relative per rounding, one
// rounding of each contribution and one of the reduced chunk), in half the
// bytes of a bf16 ring all-reduce.
TEST(CollectivesFp8, AllReduceWithinE4m3PrecisionAndHalfTheBytes) {
  auto pg = world();
  const int n = pg->size(), r = pg->rank();
  for (const int64_t numel : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
    for (const auto op : {ReduceOp::Sum, ReduceOp::Avg}) {
      at::Tensor mine = at::randn({numel}, at::make_generator<at::CPUGeneratorImpl>(100 + r)) * (1.0 + r);
      at::Tensor exact = mine.clone(), fp8 = mine.clone();
      pg->all_reduce(exact, op).wait();
      colossus::cluster::all_reduce_fp8(*pg, fp8, op);
      // The bound: 2^-4 of every contribution's magnitude and of the result's,
      // plus e4m3's subnormal spacing (2^-9 of the largest value / 448) per rounding.
      at::Tensor magnitude = mine.abs().clone();
      pg->all_reduce(magnitude, op).wait();
      at::Tensor largest = mine.abs().max().reshape({1});
      pg->all_reduce(largest, ReduceOp::Max).wait();
      const double spacing = largest.item<double>() * n / 448.0 / 512.0;
      const at::Tensor bound = (magnitude + exact.abs()) * 0.0625 + (n + 1) * spacing;
      EXPECT_TRUE(((fp8 - exact).abs() <= bound).all().item<bool>())
          << numel << " elements: max error " << (fp8 - exact).abs().max().item<double>();
      const double rel = ((fp8 - exact).norm() / exact.norm()).item<double>();
      EXPECT_LT(rel, 0.05) << numel << " elements";
      if (numel >= 1000) {
        EXPECT_GT(rel, 0.0) << "fp8 rounding should show";
      }
      at::Tensor from_zero = fp8.clone();
      pg->broadcast(from_zero, 0).wait();
      EXPECT_TRUE(at::equal(from_zero, fp8)) << "ranks disagree";
    }
  }
  // Bytes one rank sends: about half a bf16 ring all-reduce's, a quarter of fp32's.
  if (n > 1) {
    const int64_t numel = 1 << 20;
    const double fp8_bytes = static_cast<double>(colossus::cluster::fp8_all_reduce_wire_bytes(numel, n));
    const double bf16_bytes = static_cast<double>(colossus::cluster::ring_all_reduce_wire_bytes(numel, n, 2));
    EXPECT_NEAR(fp8_bytes / bf16_bytes, 0.5, 1e-3);
    if (r == 0) std::printf("[fp8 all-reduce] %d ranks, 1M elements: %.0f bytes sent per rank vs %.0f for bf16\n", n, fp8_bytes, bf16_bytes);
  }
  at::Tensor integers = at::arange(4, at::kLong);
  EXPECT_THROW(colossus::cluster::all_reduce_fp8(*pg, integers), colossus::ConfigError);
}

// The shard collectives ZeRO and Gemini use: the tally of bytes sent counts
// one byte an element plus a 4-byte scale per peer, against two bytes an
// element for the same bf16 collectives: about half.
TEST(CollectivesFp8, ShardCollectivesSendHalfOfBf16AndAgree) {
  auto pg = world();
  const int n = pg->size(), r = pg->rank();
  const int64_t chunk = 4096;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  at::Tensor input =
      (at::randn({n * chunk}, at::make_generator<at::CPUGeneratorImpl>(7 + r)) * (1.0 + r)).to(at::kBFloat16);
  const auto before = colossus::cluster::fp8_wire_bytes_sent();
  at::Tensor reduced = at::empty({chunk}, bf16), exact = at::empty({chunk}, bf16);
  colossus::cluster::reduce_scatter_fp8(*pg, reduced, input, ReduceOp::Avg);
  at::Tensor gathered = at::empty({n * chunk}, bf16);
  colossus::cluster::all_gather_fp8(*pg, gathered, reduced);
  const auto after = colossus::cluster::fp8_wire_bytes_sent();
  pg->reduce_scatter(exact, input.clone(), ReduceOp::Avg).wait();
  const double rel =
      ((reduced.to(at::kFloat) - exact.to(at::kFloat)).norm() / exact.to(at::kFloat).norm()).item<double>();
  EXPECT_LT(rel, 0.05);
  // Every rank, this one included, holds the dequantized chunks: the same
  // values.
  at::Tensor from_zero = gathered.clone();
  pg->broadcast(from_zero, 0).wait();
  EXPECT_TRUE(at::equal(from_zero, gathered)) << "ranks disagree after all_gather_fp8";
  const int64_t fp8 = after.fp8 - before.fp8, plain = after.plain - before.plain;
  EXPECT_EQ(fp8, 2 * colossus::cluster::fp8_shard_collective_wire_bytes(chunk, n));
  EXPECT_EQ(plain, 2 * (n - 1) * chunk * 2);
  if (n > 1) {
    const double ratio = static_cast<double>(fp8) / static_cast<double>(plain);
    EXPECT_NEAR(ratio, 0.5, 1e-3);
    if (r == 0)
      std::printf(
          "[fp8 reduce-scatter + all-gather] %d ranks, %lld elements a "
          "rank: %lld bytes sent vs %lld in bf16 (%.4f)\n",
          n, static_cast<long long>(chunk), static_cast<long long>(fp8), static_cast<long long>(plain), ratio);
  }
}

TEST(CollectivesAsync, ManyInFlightThenWait) {
  auto pg = world();
  int n = pg->size();
  std::vector<at::Tensor> tensors;
  std::vector<colossus::cluster::Work> works;
  for (int i = 0; i < 16; ++i) {
    tensors.push_back(at::full({4096}, i, at::kFloat));
    works.push_back(pg->all_reduce(tensors.back()));
  }
  // Compute while communication runs on the backend's worker thread.
  auto busy = at::randn({256, 256}).matmul(at::randn({256, 256}));
  EXPECT_TRUE(busy.isfinite().all().item<bool>());
  for (auto& w : works) w.wait();
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(at::equal(tensors[i], at::full({4096}, i * n, at::kFloat)));
  pg->barrier().wait();
}

TEST(CollectivesErrors, ClearMessages) {
  auto pg = world();
  int n = pg->size();
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error, expected one mentioning: " << needle;
    } catch (const colossus::DistError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { pg->broadcast(at::zeros({2}), n); }, "out of range");
  expect_error([&] { pg->send(at::zeros({2}), -1); }, "out of range");
  expect_error([&] { pg->all_reduce(at::zeros({4, 4}).t()); }, "contiguous");
  expect_error([&] { pg->reduce_scatter(at::zeros({2}), at::zeros({2 * n + 1})); }, "reduce_scatter");
  expect_error([&] { pg->all_gather_into(at::zeros({n + 1}), at::zeros({1})); }, "all_gather_into");
  expect_error([&] { pg->all_reduce(at::zeros({2}, at::kComplexFloat)); }, "not supported by the MPI backend");
  expect_error([&] { pg->all_to_all(at::zeros({n}), at::zeros({n}), std::vector<int64_t>(n + 1, 0), {}); }, "split sizes");
  // A group of ranks must still work after the errors above.
  auto t = at::ones({3});
  pg->all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::full({3}, n, at::kFloat)));
}

int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
