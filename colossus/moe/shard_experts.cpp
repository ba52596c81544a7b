#include "colossus/moe/shard_experts.h"

#include "colossus/moe/expert_parallel.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

namespace colossus::moe {

void shard_experts(models::MixtralForCausalLM& model, cluster::ProcessGroupPtr ep_group) {
  const models::MixtralConfig& config = model.mixtral_config();
  validate_ep(config.num_local_experts, ep_group ? ep_group->size() : 0);
  for (const auto& block : model.blocks()) {
    auto* layer = dynamic_cast<models::MixtralDecoderLayer*>(block.get());
    TORCH_CHECK(layer != nullptr, "shard_experts: a block is not a MixtralDecoderLayer");
    if (!layer->is_sparse()) continue;  // a Qwen-MoE dense layer: replicated like attention
    const at::Tensor& gate = layer->moe().layer_as<models::Linear>("gate").weight;
    auto sharded = std::make_shared<ExpertParallelMoeBlock>(config, gate.options(), ep_group);
    sharded->adopt_from(layer->moe());
    // Other ranks' experts: storage freed; an optimizer built before sharding
    // still lists them, but they get no gradient and so are never stepped.
    at::NoGradGuard no_grad;
    for (const auto& item : layer->moe().named_parameters(/*recurse=*/true)) {
      if (!sharded->named_parameters(/*recurse=*/true).contains(item.key())) {
        item.value().set_data(at::empty({0}, item.value().options()));
      }
    }
    sharded->train(layer->moe().is_training());
    layer->replace_moe(std::move(sharded));
  }
}

bool is_expert_parameter(const std::string& name) { return name.find(".experts.") != std::string::npos; }

}  // namespace colossus::moe
