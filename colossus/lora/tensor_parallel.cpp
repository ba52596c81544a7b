#include "colossus/lora/tensor_parallel.h"

#include "colossus/core/errors.h"
#include "colossus/lora/inject.h"
#include "colossus/parallel/plan/shard_spec.h"
#include "colossus/parallel/tensor/layers.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

namespace colossus::lora {

namespace {

torch::nn::Module& module_at(models::CausalLM& model, const std::string& path) {
  auto modules = model.named_modules("", /*include_self=*/false);
  auto* found = modules.find(path);
  if (found == nullptr) throw ConfigError(fmt::format("LoRA under tensor parallelism: no module at '{}'", path));
  return **found;
}

// The base weight's spec, moved onto an adapter dim: the same ranges along
// `dim` of the adapter matrix (its out rows for B, its in columns for A).
parallel::plan::ShardSpec adapter_spec(const parallel::plan::ShardSpec& weight_spec, int64_t dim) {
  parallel::plan::ShardSpec spec = weight_spec;
  spec.dim = dim;
  return spec;
}

}  // namespace

DetachedAdapters detach_for_sharding(models::CausalLM& model) {
  DetachedAdapters adapters = lora_layers(model);
  for (const auto& [path, layer] : adapters) models::replace_layer(model, path, layer->base());
  return adapters;
}

void attach_sharded(models::CausalLM& model, DetachedAdapters adapters, parallel::plan::ShardedModel& sharded) {
  if (adapters.empty()) return;
  at::NoGradGuard no_grad;
  const int rank = sharded.tp_group->rank();
  for (auto& [path, layer] : adapters) {
    auto& module = module_at(model, path);
    std::shared_ptr<models::Layer> parallel_base;
    TpAdapterSplit split{.group = sharded.tp_group,
                         .sequence_sharded = sharded.sequence != parallel::tensor::SequenceSharding::None};
    const auto weight_spec = sharded.specs.find(path + ".weight");
    if (dynamic_cast<parallel::tensor::ColumnParallelLinear*>(&module) != nullptr) {
      split.split = TpSplit::Column;
    } else if (dynamic_cast<parallel::tensor::RowParallelLinear*>(&module) != nullptr) {
      split.split = TpSplit::Row;
    }
    if (split.split == TpSplit::None || weight_spec == sharded.specs.end()) {
      // The plan left this layer whole (replicated): the adapter stays as it was.
      models::replace_layer(model, path, layer);
      continue;
    }
    parallel_base = std::dynamic_pointer_cast<models::Layer>(module.shared_from_this());
    const auto& spec = weight_spec->second;
    const at::Tensor A = layer->lora_A.detach(), B = layer->lora_B.detach();
    at::Tensor sliced_A = A, sliced_B = B, snap_A, snap_B;
    std::string sliced_name;
    parallel::plan::ShardSpec sliced_spec;
    if (split.split == TpSplit::Column) {
      sliced_spec = adapter_spec(spec, 0);  // B (out, r): the base's output rows
      sliced_B = parallel::plan::slice_for_rank(B, sliced_spec, rank);
      sliced_name = path + ".lora_B.weight";
      if (spec.replicas > 1) {
        // Replicated kv heads: one head of `len` rows per rank, `full / len` sets.
        const auto [start, len] = spec.ranges[rank].front();
        split.replica_slot = start / len;
        split.replica_slots = spec.full_size / len;
      }
    } else {
      sliced_spec = adapter_spec(spec, 1);  // A (r, in): the base's input columns
      sliced_A = parallel::plan::slice_for_rank(A, sliced_spec, rank);
      sliced_name = path + ".lora_A.weight";
    }
    if (layer->snapshot_A().defined()) {  // DPO's reference adapter, sliced the same way
      snap_A = split.split == TpSplit::Row ? parallel::plan::slice_for_rank(layer->snapshot_A(), sliced_spec, rank)
                                           : layer->snapshot_A();
      snap_B = split.split == TpSplit::Column ? parallel::plan::slice_for_rank(layer->snapshot_B(), sliced_spec, rank)
                                              : layer->snapshot_B();
    }
    layer->adopt_parallel_base(parallel_base, split, sliced_A, sliced_B, snap_A, snap_B);
    sharded.specs[sliced_name] = sliced_spec;
    models::replace_layer(model, path, layer);
  }
}

}  // namespace colossus::lora
