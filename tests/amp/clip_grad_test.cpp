// clip_grad_norm against torch.nn.utils.clip_grad_norm_, and the group
// reduction hook: clipping half the grads with a hook that adds the other
// half's term equals clipping all of them together.
#include "colossus/amp/clip_grad.h"
#include "colossus/core/errors.h"
#include "tests/optim/torch_oracle.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace colossus::amp {
namespace {

namespace testing = colossus::optim::testing;

const char* const kCases = R"([
  {"name": "l2_clipped", "norm_type": 2, "max_norm": 1.0, "scale": 1.0},
  {"name": "l2_not_clipped", "norm_type": 2, "max_norm": 1e6, "scale": 1.0},
  {"name": "inf_clipped", "norm_type": "inf", "max_norm": 0.5, "scale": 2.0},
  {"name": "l1_clipped", "norm_type": 1, "max_norm": 10.0, "scale": 0.1}
])";

const std::filesystem::path& reference_dir() {
  static const std::filesystem::path dir = [] {
    auto cases = nlohmann::json::parse(kCases);
    int seed = 5;
    for (auto& c : cases) {
      c["seed"] = seed++;
      c["shapes"] = nlohmann::json::parse("[[31, 17], [1000], [3, 3, 3], [1]]");
    }
    auto out = testing::scratch_dir() / "clip";
    std::filesystem::create_directories(out);
    std::ofstream(testing::scratch_dir() / "clip.json") << cases.dump();
    std::string output;
    const int rc = testing::run_oracle(
        fmt::format("clip '{}' '{}'", (testing::scratch_dir() / "clip.json").string(), out.string()), output);
    if (rc != 0) ADD_FAILURE() << "torch_oracle.py clip failed:\n" << output;
    return out;
  }();
  return dir;
}

double norm_type_of(const nlohmann::json& c) {
  return c["norm_type"].is_string() ? kInfNorm : c["norm_type"].get<double>();
}

TEST(ClipGradNorm, MatchesTorch) {
  if (!testing::python_available()) GTEST_SKIP() << "no Python oracle at " COLOSSUS_PYTHON;
  for (const auto& c : nlohmann::json::parse(kCases)) {
    const std::string name = c["name"];
    const auto ref = testing::read_tensors(reference_dir() / (name + ".safetensors"));
    std::vector<at::Tensor> grads;
    for (int i = 0; i < 4; ++i) grads.push_back(ref.at(fmt::format("g_in.{}", i)).clone());
    const double total = clip_grad_norm(grads, c["max_norm"], norm_type_of(c));
    EXPECT_NEAR(total, ref.at("total_norm").item<double>(), 1e-6 * total) << name;
    for (int i = 0; i < 4; ++i) {
      EXPECT_LE(testing::max_rel_diff(grads[static_cast<size_t>(i)], ref.at(fmt::format("g_out.{}", i))), 1e-6)
          << name << " tensor " << i;
    }
  }
}

TEST(ClipGradNorm, ReducerHookGivesTheNormOverAllRanks) {
  for (double p : {2.0, kInfNorm, 1.0}) {
    std::vector<at::Tensor> all = {at::randn({40}), at::randn({3, 5}) * 3, at::randn({100}), at::randn({2})};
    std::vector<at::Tensor> mine = {all[0].clone(), all[1].clone()};
    std::vector<at::Tensor> theirs = {all[2].clone(), all[3].clone()};
    const double expected = clip_grad_norm(all, 0.5, p);
    // The "other rank" contributes its local term; the hook combines them.
    const double their_norm = grad_norm(theirs, p);
    int calls = 0;
    NormReducer reduce = [&](const at::Tensor& local, double norm_type) {
      ++calls;
      EXPECT_EQ(norm_type, p);
      EXPECT_EQ(local.numel(), 1);
      if (std::isinf(norm_type)) return at::maximum(local, at::full_like(local, their_norm));
      return local + std::pow(their_norm, norm_type);
    };
    const double total = clip_grad_norm(mine, 0.5, p, reduce);
    EXPECT_EQ(calls, 1);
    EXPECT_NEAR(total, expected, 1e-5 * expected) << "p=" << p;
    EXPECT_LE(testing::max_rel_diff(mine[0], all[0]), 1e-5) << "p=" << p;
    EXPECT_LE(testing::max_rel_diff(mine[1], all[1]), 1e-5) << "p=" << p;
  }
}

TEST(ClipGradNorm, CpuNormsAreAccurateAtLength) {
  // An offloaded optimizer clips by a norm taken on the CPU, the device run
  // by one taken on the GPU: they must agree far below the fp32 rounding a
  // training curve amplifies (issue 27). Against the fp64 norm, for lengths
  // with and without a tail past the 4096-element rows, p = 2 and p = 1.
  at::manual_seed(3);
  for (const int64_t n : {int64_t{100}, int64_t{8192}, int64_t{1'000'003}, int64_t{4'000'000}}) {
    const at::Tensor g = at::randn({n}) * 1e-3;
    for (const double p : {2.0, 1.0}) {
      const double exact = at::linalg_vector_norm(g.to(at::kDouble), p).item<double>();
      const at::Tensor got = vector_norm(g, p);
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      EXPECT_NEAR(got.item<double>(), exact, 2e-7 * exact) << "n " << n << " p " << p;
    }
    if (n < 8192) continue;  // short 16-bit tensors keep ATen's norm in their dtype, as torch does
    const at::Tensor bf16 = g.to(at::kBFloat16);
    const double exact16 = at::linalg_vector_norm(bf16.to(at::kDouble), 2).item<double>();
    EXPECT_NEAR(vector_norm(bf16, 2).to(at::kDouble).item<double>(), exact16, 1e-6 * exact16) << "bf16 n " << n;
  }
  const at::Tensor g = at::randn({50'000});
  EXPECT_EQ(vector_norm(g, kInfNorm).item<double>(), g.abs().max().item<double>());
}

TEST(ClipGradNorm, EdgeCases) {
  EXPECT_EQ(clip_grad_norm({at::Tensor()}, 1.0), 0.0);
  EXPECT_THROW(clip_grad_norm({at::ones({2})}, -1.0), ConfigError);
  EXPECT_THROW(clip_grad_norm({at::ones({2})}, 1.0, 0.0), ConfigError);
  auto g = at::full({4}, 3.0);  // norm 6
  EXPECT_DOUBLE_EQ(clip_grad_norm({g}, 12.0), 6.0);
  EXPECT_TRUE(at::equal(g, at::full({4}, 3.0)));  // below max_norm: unchanged
}

}  // namespace
}  // namespace colossus::amp
