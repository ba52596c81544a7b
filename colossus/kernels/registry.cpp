#include "colossus/kernels/registry.h"

#include "colossus/kernels/scale.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

std::vector<KernelCheck>& kernel_list() {
  static std::vector<KernelCheck> list;
  return list;
}

// The reference is plain ATen arithmetic; the kernel under test must agree.
std::string check_scale_cpu() {
  auto data = at::randn({100003});
  data[17] = std::numeric_limits<float>::infinity();
  auto expected = data * 0.5f;
  bool bad = scale_and_check_finite_cpu(data.data_ptr<float>(), data.numel(), 0.5f);
  if (!bad) return "inf at index 17 was not reported";
  auto finite = data.isfinite();
  if (!at::equal(data.masked_select(finite), expected.masked_select(finite))) return "scaled values differ";
  auto clean = at::randn({4097});
  if (scale_and_check_finite_cpu(clean.data_ptr<float>(), clean.numel(), 2.0f)) return "finite input reported as inf/NaN";
  return {};
}

const bool registered = [] {
  register_kernel({"scale_and_check_finite", "cpu", check_scale_cpu});
  return true;
}();

}  // namespace

void register_kernel(KernelCheck check) { kernel_list().push_back(std::move(check)); }
const std::vector<KernelCheck>& registered_kernels() { return kernel_list(); }

}  // namespace colossus::kernels
