#include "colossus/moe/moe_hybrid_parallel_plugin.h"

#include "colossus/booster/ddp_plugin.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/moe/expert_parallel.h"
#include "colossus/moe/shard_experts.h"

#include <fmt/format.h>

namespace colossus::moe {

void MoeHybridParallelPluginOptions::validate() const {
  if (ep_size < 1) throw ConfigError(fmt::format("moe_hybrid_parallel.ep_size is {} but must be >= 1", ep_size));
  if (!(bucket_cap_mb > 0)) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.bucket_cap_mb is {} but must be > 0", bucket_cap_mb));
  }
  if (precision != "fp32") {
    throw ConfigError(fmt::format("moe_hybrid_parallel.precision is '{}'; only 'fp32' has landed", precision));
  }
}

MoeHybridParallelModel::MoeHybridParallelModel(std::shared_ptr<models::MixtralForCausalLM> model,
                                               cluster::ProcessGroupPtr dp_group, cluster::ProcessGroupPtr ep_group,
                                               cluster::ProcessGroupPtr moe_dp_group,
                                               const MoeHybridParallelPluginOptions& options)
    : model_(std::move(model)) {
  // Every rank starts from rank 0's values, then keeps its experts.
  booster::broadcast_tensors(model_->parameters(), *dp_group);
  shard_experts(*model_, ep_group);
  booster::GradReducer::NamedParams dense, experts;
  const double ep = static_cast<double>(ep_group->size());
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (is_expert_parameter(item.key())) {
      // An expert's gradient already sums the ep group's ranks (the all-to-all's
      // backward); averaging over moe_dp then dividing by ep averages over dp.
      at::Tensor p = item.value();
      if (ep > 1) p.register_hook([ep](const at::Tensor& grad) { return grad / ep; });
      experts.emplace_back(item.key(), p);
    } else {
      dense.emplace_back(item.key(), item.value());
    }
  }
  const booster::GradReducerOptions reducer{.bucket_cap_mb = options.bucket_cap_mb, .find_unused_parameters = false};
  dense_reducer_ = std::make_unique<booster::GradReducer>(std::move(dense), dp_group, reducer);
  expert_reducer_ = std::make_unique<booster::GradReducer>(std::move(experts), moe_dp_group, reducer);
}

void MoeHybridParallelModel::set_grad_sync(bool enabled) {
  dense_reducer_->set_sync_enabled(enabled);
  expert_reducer_->set_sync_enabled(enabled);
}

MoeHybridParallelPlugin::MoeHybridParallelPlugin(MoeHybridParallelPluginOptions options, cluster::ProcessGroupPtr world)
    : options_(std::move(options)), world_(world ? std::move(world) : cluster::current_cluster().world) {
  options_.validate();
  const int64_t w = world_->size();
  if (w % options_.ep_size != 0) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.ep_size is {} but must divide the dp size (world size {})",
                                  options_.ep_size, w));
  }
  const int moe_dp = static_cast<int>(w / options_.ep_size), ep = static_cast<int>(options_.ep_size);
  cluster::MeshAxes axes = options_.moe_dp_outside ? cluster::MeshAxes{{"moe_dp", moe_dp}, {"ep", ep}}
                                                   : cluster::MeshAxes{{"ep", ep}, {"moe_dp", moe_dp}};
  // The mesh lays out a copy of the world: an axis spanning every rank may be
  // the root group itself, and the experts' reducer, the dispatch all-to-all
  // and the dense reducer (on world_) must each own their communicator, or
  // their interleaved collectives would mismatch across ranks.
  auto layout_root = world_->split(0, world_->rank(), "moe_hybrid_parallel");
  mesh_ = std::make_unique<cluster::ProcessGroupMesh>(layout_root, std::move(axes));
}

std::shared_ptr<booster::ModelWrapper> MoeHybridParallelPlugin::wrap_model(std::shared_ptr<models::CausalLM> model) {
  auto mixtral = std::dynamic_pointer_cast<models::MixtralForCausalLM>(model);
  if (!mixtral) {
    throw ConfigError(fmt::format("MoeHybridParallelPlugin needs a Mixtral model (model_type mixtral); got {}",
                                  model ? models::model_type(model->config()) : std::string("null")));
  }
  validate_ep(mixtral->mixtral_config().num_local_experts, options_.ep_size);
  // The dense reducer gets its own communicator too (not the caller's world).
  auto dense_group = world_->split(0, world_->rank(), "moe_hybrid_parallel_dense");
  return std::make_shared<MoeHybridParallelModel>(std::move(mixtral), dense_group, ep_group(), moe_dp_group(),
                                                  options_);
}

}  // namespace colossus::moe
