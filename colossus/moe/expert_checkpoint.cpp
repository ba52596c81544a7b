#include "colossus/moe/expert_checkpoint.h"

#include "colossus/models/pretrained.h"
#include "colossus/moe/shard_experts.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

namespace colossus::moe {

std::map<std::string, at::Tensor> gather_full_state(models::MixtralForCausalLM& model, cluster::ProcessGroup& ep_group,
                                                    const WholeParameter& whole) {
  const auto& config = model.mixtral_config();
  const int64_t local = config.num_local_experts / ep_group.size();
  // Names, order and shapes of the full model, without allocating it.
  auto full = models::create_model(config, {.device = c10::kMeta, .init = false});
  auto mine = model.named_parameters(/*recurse=*/true);
  std::map<std::string, at::Tensor> state;
  at::NoGradGuard no_grad;
  for (const auto& item : full->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const at::Tensor* own = mine.find(name);
    if (!is_expert_parameter(name)) {
      TORCH_CHECK(own != nullptr, "gather_full_state: the model has no ", name);
      state[name] = whole ? whole(name, *own) : own->detach();
      continue;
    }
    // "...experts.M.wX.weight": M's owner broadcasts it.
    const size_t at = name.find(".experts.") + 9;
    const int64_t expert = std::stoll(name.substr(at, name.find('.', at) - at));
    const int owner = static_cast<int>(expert / local);
    const auto options = mine.begin()->value().options();
    TORCH_CHECK(owner != ep_group.rank() || own != nullptr, "gather_full_state: this rank should hold ", name);
    at::Tensor value = owner != ep_group.rank() ? at::empty(item.value().sizes(), options)
                       : whole                  ? whole(name, *own).contiguous()
                                                : own->detach().contiguous();
    ep_group.broadcast(value, owner).wait();
    state[name] = value;
  }
  return state;
}

void save_expert_parallel_pretrained(models::MixtralForCausalLM& model, cluster::ProcessGroup& ep_group,
                                     const std::string& dir, bool write, const WholeParameter& whole) {
  auto state = gather_full_state(model, ep_group, whole);
  if (!write) return;
  const auto dtype = state.begin()->second.scalar_type();
  auto full = models::create_model(model.mixtral_config(), {.dtype = dtype, .init = false});
  models::load_state_dict(*full, state, "expert-parallel model");
  models::save_pretrained(*full, dir);
}

}  // namespace colossus::moe
