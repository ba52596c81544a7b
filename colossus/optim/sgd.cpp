#include "colossus/optim/sgd.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colossus::optim {

SGD::SGD(std::vector<at::Tensor> params, SGDOptions options)
    : SGD(single_group(std::move(params), options.lr, options.weight_decay), options, false) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options) : SGD(std::move(groups), options, true) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options, bool groups_given)
    : StatefulOptimizer(std::move(groups), {{"momentum", options.momentum},
                                            {"dampening", options.dampening},
                                            {"nesterov", options.nesterov ? 1.0 : 0.0}}) {
  if (groups_given) {
    const SGDOptions defaults;
    reject_unused_group_defaults(options.lr != defaults.lr, options.weight_decay != defaults.weight_decay);
  }
  finish_construction();
}

void SGD::validate_group(const ParamGroup& group, size_t group_index) const {
  const double momentum = option(group, "momentum"), dampening = option(group, "dampening");
  const double nesterov = option(group, "nesterov");
  if (!(momentum >= 0.0)) {
    throw ConfigError(fmt::format("SGD: momentum={} in param group {} is negative; use a value >= 0, e.g. 0.9",
                                  momentum, group_index));
  }
  if (nesterov != 0.0 && nesterov != 1.0) {
    throw ConfigError(fmt::format("SGD: nesterov={} in param group {} must be 0 or 1", nesterov, group_index));
  }
  if (nesterov == 1.0 && (momentum <= 0.0 || dampening != 0.0)) {
    throw ConfigError(fmt::format("SGD: nesterov needs momentum > 0 and dampening = 0, but param group {} has "
                                  "momentum={} and dampening={}; e.g. use momentum = 0.9, dampening = 0",
                                  group_index, momentum, dampening));
  }
}

// torch/optim/sgd.py, _single_tensor_sgd.
void SGD::step() {
  for_each_param_with_grad([&](const ParamGroup& group, at::Tensor& param, const at::Tensor& grad, ParamState& st) {
    const double momentum = option(group, "momentum"), dampening = option(group, "dampening");
    at::Tensor g = grad;
    if (group.weight_decay != 0.0) g = g.add(param, group.weight_decay);
    if (momentum != 0.0) {
      at::Tensor& buf = st.slots["momentum_buffer"];
      if (!buf.defined()) {
        buf = g.detach().clone();
      } else {
        buf.mul_(momentum).add_(g, 1.0 - dampening);
      }
      g = option(group, "nesterov") != 0.0 ? g.add(buf, momentum) : buf;
    }
    param.add_(g, -group.lr);
    st.step += 1;
  });
}

std::vector<std::string> SGD::required_slots(const ParamGroup& group) const {
  if (option(group, "momentum") == 0.0) return {};
  return slot_names();
}

}  // namespace colossus::optim
