#include "colossus/moe/expert_parallel.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

namespace colossus::moe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor exchange(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                    const std::vector<int64_t>& input_splits, cluster::ProcessGroup& group) {
  const int64_t out_rows = std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0});
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = out_rows;
  at::Tensor in = input.contiguous();
  at::Tensor out = at::empty(shape, in.options());
  group.all_to_all(out, in, output_splits, input_splits).wait();
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, std::vector<int64_t> output_splits,
                            std::vector<int64_t> input_splits, cluster::ProcessGroup* group) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["output_splits"] = output_splits;
    ctx->saved_data["input_splits"] = input_splits;
    return exchange(input, output_splits, input_splits, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& group = *reinterpret_cast<cluster::ProcessGroup*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    const auto output_splits = ctx->saved_data["output_splits"].toIntVector();
    const auto input_splits = ctx->saved_data["input_splits"].toIntVector();
    return {exchange(grads[0], input_splits, output_splits, group), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void validate_ep(int64_t num_experts, int64_t ep_size) {
  if (ep_size < 1 || num_experts % ep_size != 0) {
    throw ConfigError(
        fmt::format("ep_size is {} but must divide num_local_experts ({}); use "
                    "an ep_size among the divisors of {}",
                    ep_size, num_experts, num_experts));
  }
}

at::Tensor all_to_all_rows(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits, cluster::ProcessGroup& group) {
  return AllToAllRows::apply(input, output_splits, input_splits, &group);
}

namespace {

int64_t checked_local(const models::MixtralConfig& config, const cluster::ProcessGroupPtr& group) {
  if (!group) throw ConfigError("ExpertParallelMoeBlock: the ep process group is null");
  validate_ep(config.num_local_experts, group->size());
  return config.num_local_experts / group->size();
}

}  // namespace

ExpertParallelMoeBlock::ExpertParallelMoeBlock(const models::MixtralConfig& config, const at::TensorOptions& options,
                                               cluster::ProcessGroupPtr ep_group)
    : SparseMoeBlock(config, options, checked_local(config, ep_group) * ep_group->rank(),
                     checked_local(config, ep_group)),
      group_(std::move(ep_group)) {}

void ExpertParallelMoeBlock::load_from(const models::SparseMoeBlock& full) {
  at::NoGradGuard no_grad;
  auto mine = named_parameters(/*recurse=*/true);
  auto theirs = full.named_parameters(/*recurse=*/true);
  for (const auto& item : mine) {
    const at::Tensor* source = theirs.find(item.key());
    TORCH_CHECK(source != nullptr, "load_from: the full block has no ", item.key());
    item.value().copy_(*source);
  }
}

void ExpertParallelMoeBlock::adopt_from(const models::SparseMoeBlock& full) {
  auto theirs = full.named_children();
  auto gate = std::dynamic_pointer_cast<models::Layer>(theirs["gate"]);
  TORCH_CHECK(gate != nullptr, "adopt_from: the full block has no gate layer");
  replace_layer("gate", gate);
  if (has_shared_expert()) {
    // Qwen2-MoE's shared expert runs every token on every rank: adopted whole, never sharded.
    auto shared_gate = std::dynamic_pointer_cast<models::Layer>(theirs["shared_expert_gate"]);
    TORCH_CHECK(shared_gate != nullptr && theirs.contains("shared_expert"), "adopt_from: the full block has no shared expert");
    replace_layer("shared_expert_gate", shared_gate);
    replace_module("shared_expert", theirs["shared_expert"]);
  }
  auto their_experts = theirs["experts"]->named_children();
  auto my_experts = named_children()["experts"];
  for (int64_t e = first_expert(); e < first_expert() + local_experts(); ++e) {
    const std::string name = std::to_string(e);
    TORCH_CHECK(their_experts.contains(name), "adopt_from: the full block has no expert ", e);
    my_experts->replace_module(name, their_experts[name]);
  }
  // The adopted experts view the full block's buffers: give them their own,
  // so the other ranks' experts can really be freed.
  pack_experts();
}

at::Tensor ExpertParallelMoeBlock::run_experts(const at::Tensor& x_sorted, const std::vector<int64_t>& counts) {
  const int64_t ep = group_->size(), local = local_experts();
  // recv_counts[s * local + l]: rows rank s sends for our local expert l.
  at::Tensor send_counts = at::tensor(counts, at::kLong);
  at::Tensor recv_counts_t =
      exchange(send_counts, std::vector<int64_t>(ep, local), std::vector<int64_t>(ep, local), *group_);
  const int64_t* recv_counts = recv_counts_t.data_ptr<int64_t>();
  std::vector<int64_t> send_splits(ep, 0), recv_splits(ep, 0), expert_rows(local, 0);
  for (int64_t r = 0; r < ep; ++r) {
    for (int64_t l = 0; l < local; ++l) {
      send_splits[r] += counts[r * local + l];
      recv_splits[r] += recv_counts[r * local + l];
      expert_rows[l] += recv_counts[r * local + l];
    }
  }
  at::Tensor received = all_to_all_rows(x_sorted, recv_splits, send_splits,
                                        *group_);  // rows by (source, local expert)
  // Regroup by local expert: segment (s, l) starts at offset[s][l] in
  // `received`.
  std::vector<int64_t> offsets(ep * local, 0);
  for (int64_t i = 1; i < ep * local; ++i) offsets[i] = offsets[i - 1] + recv_counts[i - 1];
  std::vector<at::Tensor> pieces;
  for (int64_t l = 0; l < local; ++l) {
    for (int64_t s = 0; s < ep; ++s) {
      const int64_t n = recv_counts[s * local + l];
      if (n > 0) pieces.push_back(at::arange(offsets[s * local + l], offsets[s * local + l] + n, at::kLong));
    }
  }
  at::Tensor by_expert = pieces.empty() ? at::empty({0}, at::kLong) : at::cat(pieces);  // regrouped row -> received row
  at::Tensor grouped = received.index_select(0, by_expert.to(received.device()));
  at::Tensor computed = run_local_experts(grouped, expert_rows);
  // Back to the received order, then to the senders.
  at::Tensor inverse = at::argsort(by_expert).to(computed.device());
  at::Tensor unsorted = computed.index_select(0, inverse);
  return all_to_all_rows(unsorted, send_splits, recv_splits, *group_);
}

}  // namespace colossus::moe
