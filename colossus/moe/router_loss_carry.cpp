#include "colossus/moe/router_loss_carry.h"

#include <ATen/ATen.h>

namespace colossus::moe {

booster::HybridPipeline::PipelineCarry router_loss_carry(const models::MixtralForCausalLM& model) {
  const auto& config = model.mixtral_config();
  const int64_t experts = config.num_local_experts, top_k = config.num_experts_per_tok;
  booster::HybridPipeline::PipelineCarry carry;
  carry.numel = 2 * experts + 2;
  carry.extend = [&model, experts, top_k](const at::Tensor& incoming, int64_t block_begin, int64_t block_end) {
    const auto blocks = model.moe_blocks();
    std::vector<at::Tensor> terms;
    for (int64_t layer = block_begin; layer < block_end; ++layer) {
      // (N, E) router logits of this microbatch's forward through the layer.
      const at::Tensor logits = blocks.at(static_cast<size_t>(layer))->last_router_logits().to(at::kFloat);
      const at::Tensor probs = at::softmax(logits, -1);
      const at::Tensor selected = std::get<1>(at::topk(probs, top_k, -1));
      const at::Tensor counts =
          at::zeros({experts}, probs.options())
              .scatter_add_(0, selected.reshape(-1), at::ones({selected.numel()}, probs.options()));
      const at::Tensor z = at::logsumexp(logits, -1).pow(2).sum().reshape({1});
      const at::Tensor rows = at::full({1}, static_cast<double>(logits.size(0)), probs.options());
      terms.push_back(at::cat({counts, probs.sum(0), z, rows}));
    }
    at::Tensor out = incoming;
    for (const auto& t : terms) out = out.defined() ? out + t : t;
    // A stage without layers passes the vector on (or starts it).
    return out.defined() ? out : at::zeros({2 * experts + 2}, at::kFloat);
  };
  carry.finish = [&model, experts](const at::Tensor& loss, const at::Tensor& carried, int64_t num_microbatches) {
    const auto& c = model.mixtral_config();
    const at::Tensor rows = carried.narrow(0, 2 * experts + 1, 1).detach();
    at::Tensor router = at::zeros({}, carried.options());
    if (c.output_router_logits) {
      const at::Tensor tokens_per_expert = carried.narrow(0, 0, experts).detach() / rows;
      const at::Tensor prob_per_expert = carried.narrow(0, experts, experts) / rows;
      router = router + c.router_aux_loss_coef * (tokens_per_expert * prob_per_expert).sum() *
                            static_cast<double>(experts);
    }
    if (c.router_z_loss_coef > 0) {
      router = router + c.router_z_loss_coef * (carried.narrow(0, 2 * experts, 1) / rows).sum();
    }
    return loss + (router / static_cast<double>(num_microbatches)).to(loss.scalar_type());
  };
  return carry;
}

}  // namespace colossus::moe
