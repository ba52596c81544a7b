#include "colossus/parallel/plan/sharder.h"

#include "colossus/core/errors.h"
#include "colossus/parallel/tensor/layers.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <variant>

namespace colossus::parallel::plan {

namespace {

struct Shape {
  int64_t heads, kv_heads, head_dim, ffn;
};

Shape shape_of(const models::ModelConfig& config) {
  if (const auto* g = std::get_if<models::GPT2Config>(&config))
    return {g->n_head, g->n_head, g->head_dim(), g->ffn_size()};
  // Mixtral's experts stay whole (expert parallelism splits them, not tp):
  // only its LLaMA attention is sharded, so it has no FFN width to divide.
  if (const auto* m = std::get_if<models::MixtralConfig>(&config))
    return {m->num_attention_heads, m->kv_heads(), m->resolved_head_dim(), 0};
  if (std::holds_alternative<models::DeepseekConfig>(config)) {
    throw ConfigError(fmt::format("tensor parallelism has no plan for {} (multi-head latent attention) yet; use tp_size 1",
                                  models::model_type(config)));
  }
  const auto& l = std::get<models::LlamaConfig>(config);
  return {l.num_attention_heads, l.kv_heads(), l.resolved_head_dim(), l.intermediate_size};
}

// Narrows the parameter to this rank's slice in place (same tensor object).
void narrow_param(at::Tensor& param, const ShardSpec& spec, int rank) {
  at::NoGradGuard no_grad;
  param.set_data(slice_for_rank(param.detach(), spec, rank));
}

class Sharder {
 public:
  Sharder(models::CausalLM& model, cluster::ProcessGroupPtr group, const ShardOptions& options)
      : model_(model), group_(std::move(group)), tp_(group_->size()), rank_(group_->rank()), options_(options) {
    result_.tp_group = group_;
    result_.sequence = options_.sequence;
  }

  void apply(const std::string& path, const Style& style) {
    switch (style.kind) {
      case StyleKind::Colwise:
        return colwise(path, style);
      case StyleKind::Rowwise:
        return rowwise(path, style);
      case StyleKind::VocabParallelEmbedding:
        return embedding(path);
      case StyleKind::VocabParallelHead:
        return head(path);
    }
  }

  ShardedModel finish() && { return std::move(result_); }

 private:
  torch::nn::Module& module_at(const std::string& path) {
    auto modules = model_.named_modules("", /*include_self=*/false);
    auto* found = modules.find(path);
    if (found == nullptr) throw ConfigError(fmt::format("sharding plan: no module at '{}'", path));
    return **found;
  }

  // The (weight, bias, layout) of a Linear or Conv1D leaf, and the FP8
  // recipe of an FP8 one (models::enable_fp8), which its parallel form keeps.
  struct LinearLeaf {
    at::Tensor weight, bias;
    tensor::WeightLayout layout;
    std::optional<models::Fp8Recipe> fp8;
  };
  LinearLeaf linear_at(const std::string& path, const char* style) {
    auto& module = module_at(path);
    if (auto* linear = dynamic_cast<models::Linear*>(&module)) {
      const auto* fp8 = dynamic_cast<models::Fp8Linear*>(linear);
      return {linear->weight, linear->bias, tensor::WeightLayout::OutIn,
              fp8 ? std::optional(fp8->recipe()) : std::nullopt};
    }
    if (auto* conv = dynamic_cast<models::Conv1D*>(&module)) {
      const auto* fp8 = dynamic_cast<models::Fp8Conv1D*>(conv);
      return {conv->weight, conv->bias, tensor::WeightLayout::InOut, fp8 ? std::optional(fp8->recipe()) : std::nullopt};
    }
    throw ConfigError(
        fmt::format("sharding plan: {} needs a Linear or Conv1D at '{}', found {}", style, path, module.name()));
  }

  void colwise(const std::string& path, const Style& style) {
    auto [weight, bias, layout, fp8] = linear_at(path, "Colwise");
    const int64_t out_dim = layout == tensor::WeightLayout::OutIn ? 0 : 1;
    const int64_t out = weight.size(out_dim);
    const Shape shape = shape_of(model_.config());
    ShardSpec spec;
    tensor::ColumnParallelOptions options{
        .layout = layout, .gather_output = style.gather_output, .sequence = options_.sequence, .fp8 = fp8};
    if (style.gather_output && options_.sequence != tensor::SequenceSharding::None) {
      throw ConfigError(fmt::format("sharding plan: '{}' is Colwise with gather_output, which sequence parallelism "
                                    "(split_gather / ring) cannot shard along the sequence; drop gather_output",
                                    path));
    }
    if (style.kv_heads && out / shape.head_dim < tp_ && tp_ % (out / shape.head_dim) == 0) {
      // Fewer kv heads than ranks: rank r keeps the one kv head its query
      // heads [r*H/tp, (r+1)*H/tp) attend with; tp/KV ranks share each.
      const int64_t kv = out / shape.head_dim, d = shape.head_dim, group_size = shape.heads / kv;
      spec = ShardSpec{.dim = out_dim, .full_size = out, .true_size = out, .replicas = tp_ / kv};
      for (int64_t r = 0; r < tp_; ++r) spec.ranges.push_back({{(r * (shape.heads / tp_)) / group_size * d, d}});
      options.replica_slot = spec.ranges[rank_][0].first / d;
      options.replica_slots = kv;
    } else {
      if (out % (style.fused_parts * tp_) != 0) {
        throw ConfigError(
            fmt::format("tensor parallel: '{}' has {} output features, which do not split into {} "
                        "part(s) over tp={}; pick a tp that divides them",
                        path, out, style.fused_parts, tp_));
      }
      spec = ShardSpec::even(out_dim, out, tp_, style.fused_parts);
    }
    if (style.gather_output && style.fused_parts > 1) {
      throw ConfigError(fmt::format("tensor parallel: '{}' is fused ({} parts); gather_output would interleave them",
                                    path, style.fused_parts));
    }
    narrow_param(weight, spec, rank_);
    result_.specs[path + ".weight"] = spec;
    if (bias.defined()) {
      ShardSpec bias_spec = spec;
      bias_spec.dim = 0;
      narrow_param(bias, bias_spec, rank_);
      result_.specs[path + ".bias"] = bias_spec;
    }
    models::replace_layer(model_, path, std::make_shared<tensor::ColumnParallelLinear>(weight, bias, group_, options));
  }

  void rowwise(const std::string& path, const Style& style) {
    auto [weight, bias, layout, fp8] = linear_at(path, "Rowwise");
    const int64_t in_dim = layout == tensor::WeightLayout::OutIn ? 1 : 0;
    const int64_t in = weight.size(in_dim);
    if (in % tp_ != 0) {
      throw ConfigError(
          fmt::format("tensor parallel: '{}' has {} input features, which do not split over tp={}", path, in, tp_));
    }
    if (!style.input_is_parallel && options_.sequence != tensor::SequenceSharding::None) {
      throw ConfigError(fmt::format("sharding plan: '{}' is Rowwise with a replicated input, which sequence "
                                    "parallelism (split_gather / ring) does not support; use Rowwise()",
                                    path));
    }
    ShardSpec spec = ShardSpec::even(in_dim, in, tp_);
    narrow_param(weight, spec, rank_);
    result_.specs[path + ".weight"] = spec;
    models::replace_layer(
        model_, path,
        std::make_shared<tensor::RowParallelLinear>(
            weight, bias, group_,
            tensor::RowParallelOptions{
                .layout = layout, .input_is_parallel = style.input_is_parallel, .sequence = options_.sequence,
                .fp8 = fp8}));
  }

  ShardSpec vocab_spec(int64_t vocab) {
    const int64_t multiple = std::max<int64_t>(options_.make_vocab_size_divisible_by, 1) * tp_;
    const int64_t padded = (vocab + multiple - 1) / multiple * multiple;
    ShardSpec spec = ShardSpec::even(0, padded, tp_);
    spec.true_size = vocab;
    result_.padded_vocab = padded;
    result_.vocab = {.vocab_start = spec.ranges[rank_][0].first, .true_vocab = vocab};
    return spec;
  }

  void embedding(const std::string& path) {
    auto* embedding = dynamic_cast<models::Embedding*>(&module_at(path));
    if (embedding == nullptr)
      throw ConfigError(fmt::format("sharding plan: VocabParallelEmbedding needs an Embedding at '{}'", path));
    at::Tensor weight = embedding->weight;
    ShardSpec spec = vocab_spec(weight.size(0));
    narrow_param(weight, spec, rank_);
    result_.specs[path + ".weight"] = spec;
    embedding_sharded_ = true;
    models::replace_layer(model_, path,
                          std::make_shared<tensor::VocabParallelEmbedding>(
                              weight, result_.vocab.vocab_start, embedding->padding_idx, group_, options_.sequence));
  }

  void head(const std::string& path) {
    auto [weight, bias, layout, fp8] = linear_at(path, "VocabParallelHead");
    if (bias.defined() || layout != tensor::WeightLayout::OutIn) {
      throw ConfigError(fmt::format("sharding plan: VocabParallelHead needs a bias-free nn.Linear at '{}'", path));
    }
    if (fp8) {  // enable_fp8 leaves the head in its dtype; a custom policy must too
      throw ConfigError(fmt::format("sharding plan: the head at '{}' is an FP8 layer; VocabParallelHead runs in the "
                                    "model's dtype",
                                    path));
    }
    ShardSpec spec = vocab_spec(weight.size(0));
    narrow_param(weight, spec, rank_);
    result_.specs[path + ".weight"] = spec;
    result_.vocab_parallel_logits = true;
    models::replace_layer(model_, path, std::make_shared<tensor::VocabParallelHead>(weight, group_, options_.sequence));
  }

 public:
  void tie_head() {
    if (!embedding_sharded_) {
      throw ConfigError(
          "sharding plan: the head is tied to the embedding, so VocabParallelHead needs the embedding "
          "sharded by VocabParallelEmbedding too");
    }
    result_.tied_head = true;
    result_.vocab_parallel_logits = true;
  }
  bool embedding_sharded() const { return embedding_sharded_; }

 private:
  models::CausalLM& model_;
  cluster::ProcessGroupPtr group_;
  int64_t tp_;
  int rank_;
  ShardOptions options_;
  ShardedModel result_;
  bool embedding_sharded_ = false;
};

}  // namespace

bool ShardedModel::grad_partial_over_tp(const std::string& name) const {
  return head_local.contains(name) || (sequence != tensor::SequenceSharding::None && !specs.contains(name));
}

int64_t ShardedModel::replicas(const std::string& name) const {
  auto it = specs.find(name);
  return it == specs.end() ? (tp_group ? tp_group->size() : 1) : it->second.replicas;
}

void validate_tp(const models::ModelConfig& config, int64_t tp) {
  const Shape s = shape_of(config);
  if (tp < 1) throw ConfigError(fmt::format("tp_size = {} must be >= 1", tp));
  if (s.heads % tp != 0) {
    throw ConfigError(
        fmt::format("tp_size = {} does not divide the {} attention heads; use a divisor of {}", tp, s.heads, s.heads));
  }
  if (s.kv_heads % tp != 0 && tp % s.kv_heads != 0) {
    throw ConfigError(
        fmt::format("tp_size = {} and the {} key/value heads: one must divide the other", tp, s.kv_heads));
  }
  if (s.ffn % tp != 0) {
    throw ConfigError(fmt::format("tp_size = {} does not divide the FFN width {}", tp, s.ffn));
  }
}

ShardedModel shard_model(models::CausalLM& model, const ShardingPlan& plan, cluster::ProcessGroupPtr tp_group,
                         const ShardOptions& options) {
  if (!tp_group) throw ConfigError("shard_model: the tp group is null");
  validate_tp(model.config(), tp_group->size());
  std::vector<std::string> paths;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) paths.push_back(item.key());
  Sharder sharder(model, tp_group, options);
  for (const auto& [pattern, style] : plan.rules) {
    bool matched = false;
    for (const auto& path : paths) {
      if (!path_matches(pattern, path)) continue;
      matched = true;
      sharder.apply(path, style);
    }
    if (matched) continue;
    if (style.kind == StyleKind::VocabParallelHead && model.tied_embeddings()) {
      sharder.tie_head();
      continue;
    }
    throw ConfigError(fmt::format("sharding plan: pattern '{}' matches no module of {}", pattern, model.name()));
  }
  if (model.tied_embeddings() && sharder.embedding_sharded()) sharder.tie_head();
  const bool embedding_sharded = sharder.embedding_sharded();
  ShardedModel sharded = std::move(sharder).finish();
  for (const auto& pattern : plan.head_local) {
    bool matched = false;
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      const auto dot = item.key().rfind('.');
      if (dot == std::string::npos || !path_matches(pattern, item.key().substr(0, dot))) continue;
      matched = true;
      if (tp_group->size() > 1) sharded.head_local.insert(item.key());
    }
    if (!matched) throw ConfigError(fmt::format("sharding plan: head_local pattern '{}' matches no module of {}", pattern, model.name()));
  }
  if (options.sequence != tensor::SequenceSharding::None && (!embedding_sharded || !sharded.vocab_parallel_logits)) {
    throw ConfigError(
        "sharding plan: sequence parallelism (split_gather / ring) needs the embedding sharded by "
        "VocabParallelEmbedding and the head by VocabParallelHead (the default plans do)");
  }
  return sharded;
}

}  // namespace colossus::parallel::plan
