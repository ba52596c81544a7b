#include "colossus/models/moe_layer.h"

#include "colossus/core/errors.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/moe_permute.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace colossus::models::moe {

Routing route(const at::Tensor& router_logits, int64_t top_k, bool normalize) {
  at::Tensor probs = at::softmax(router_logits.to(at::kFloat), -1);
  auto [top_weights, top_experts] = at::topk(probs, top_k, -1);
  if (normalize) top_weights = top_weights / top_weights.sum(-1, /*keepdim=*/true);
  return Routing{.logits = router_logits, .weights = top_weights, .experts = top_experts};
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  TORCH_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits");
  at::Tensor logits = at::cat(router_logits, 0);  // (L*N, E): HF sums counts and rows over layers
  at::Tensor probs = at::softmax(logits.to(at::kFloat), -1);
  at::Tensor selected = std::get<1>(at::topk(probs, top_k, -1));
  at::Tensor counts = at::zeros({num_experts}, probs.options())
                          .scatter_add_(0, selected.reshape(-1), at::ones({selected.numel()}, probs.options()));
  const double rows = static_cast<double>(logits.size(0));
  at::Tensor tokens_per_expert = counts / rows;
  at::Tensor prob_per_expert = probs.sum(0) / rows;
  return (tokens_per_expert * prob_per_expert).sum() * static_cast<double>(num_experts);
}

at::Tensor router_z_loss(const std::vector<at::Tensor>& router_logits) {
  TORCH_CHECK(!router_logits.empty(), "router_z_loss: no router logits");
  return at::logsumexp(at::cat(router_logits, 0).to(at::kFloat), -1).pow(2).mean();
}

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts) {
  return static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(num_experts)));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::MoeRowsDtype rows_dtype(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: return kernels::MoeRowsDtype::kFloat32;
    case at::kHalf: return kernels::MoeRowsDtype::kFloat16;
    default: return kernels::MoeRowsDtype::kBFloat16;
  }
}

int cuda_index_of(const at::Tensor& x) { return static_cast<int>(x.device().index()); }

// out (rows, H) = in[source] * (scale or 1); in, out contiguous, one dtype.
void run_permute(const at::Tensor& in, at::Tensor& out, const at::Tensor& source, const at::Tensor& scale) {
  const kernels::MoePermuteArgs args{.in = in.const_data_ptr(),
                                     .out = out.data_ptr(),
                                     .dtype = rows_dtype(in),
                                     .rows = out.size(0),
                                     .width = out.size(1),
                                     .source = source.const_data_ptr<int64_t>(),
                                     .scale = scale.defined() ? scale.const_data_ptr<float>() : nullptr};
  TORCH_CHECK(kernels::cuda_slots().moe_permute(args, cuda_index_of(in)), "moe_permute kernel refused rows of width ",
              args.width);
}

// out (tokens, H) = sum over each token's kept rows of in[row] * (weight or 1).
void run_unpermute(const at::Tensor& in, at::Tensor& out, const at::Tensor& row_of, int64_t top_k,
                   const at::Tensor& weight) {
  const kernels::MoeUnpermuteArgs args{.in = in.const_data_ptr(),
                                       .out = out.data_ptr(),
                                       .dtype = rows_dtype(in),
                                       .tokens = out.size(0),
                                       .top_k = top_k,
                                       .width = out.size(1),
                                       .row_of = row_of.const_data_ptr<int64_t>(),
                                       .row_weight = weight.defined() ? weight.const_data_ptr<float>() : nullptr};
  TORCH_CHECK(kernels::cuda_slots().moe_unpermute(args, cuda_index_of(in)), "moe_unpermute kernel refused rows of width ",
              args.width);
}

// x (N, H) -> (M, H) rows in plan order; backward: each token's rows summed.
struct PermuteRows : torch::autograd::Function<PermuteRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& token_index,
                            const at::Tensor& row_of, int64_t top_k) {
    const at::Tensor in = x.contiguous();
    at::Tensor out = at::empty({token_index.size(0), in.size(1)}, in.options());
    run_permute(in, out, token_index, at::Tensor());
    ctx->save_for_backward({row_of});
    ctx->saved_data["top_k"] = top_k;
    ctx->saved_data["tokens"] = in.size(0);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor row_of = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor grad_x = at::empty({ctx->saved_data["tokens"].toInt(), g.size(1)}, g.options());
    run_unpermute(g, grad_x, row_of, ctx->saved_data["top_k"].toInt(), at::Tensor());
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// y (M, H), weight (M) fp32 -> (tokens, H) = sum of each token's weight * row;
// backward: grad_y = weight * grad_out[token], grad_weight = <grad_out[token], y>.
struct CombineRows : torch::autograd::Function<CombineRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& weight,
                            const at::Tensor& token_index, const at::Tensor& row_of, int64_t top_k, int64_t tokens) {
    const at::Tensor rows = y.contiguous();
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    at::Tensor out = at::empty({tokens, rows.size(1)}, rows.options());
    run_unpermute(rows, out, row_of, top_k, w);
    ctx->save_for_backward({rows, w, token_index});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &w = saved[1], &token_index = saved[2];
    const at::Tensor g = grads[0].to(rows.scalar_type()).contiguous();
    at::Tensor grad_rows = at::empty_like(rows);
    run_permute(g, grad_rows, token_index, w);
    at::Tensor grad_w = at::empty({rows.size(0)}, rows.options().dtype(at::kFloat));
    const kernels::MoeRowDotArgs args{.grad_out = g.const_data_ptr(),
                                      .rows_in = rows.const_data_ptr(),
                                      .dtype = rows_dtype(rows),
                                      .rows = rows.size(0),
                                      .width = rows.size(1),
                                      .token_index = token_index.const_data_ptr<int64_t>(),
                                      .grad_weight = grad_w.data_ptr<float>()};
    TORCH_CHECK(kernels::cuda_slots().moe_row_dot(args, cuda_index_of(rows)), "moe_row_dot kernel refused rows of width ",
                args.width);
    return {grad_rows, grad_w, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool dispatch_kernels_available(const at::Tensor& x) {
  const auto& slots = kernels::cuda_slots();
  if (!slots.moe_sort || !slots.moe_permute || !slots.moe_unpermute || !slots.moe_row_dot) return false;
  const at::ScalarType t = x.scalar_type();
  return x.is_cuda() && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16);
}

at::Tensor permute(const at::Tensor& x, const DispatchPlan& plan) {
  if (!plan.row_of.defined()) return x.index_select(0, plan.token_index);
  return PermuteRows::apply(x, plan.token_index, plan.row_of, plan.top_k);
}

DispatchPlan plan_dispatch(const Routing& routing, int64_t num_experts, std::optional<int64_t> capacity,
                           bool use_kernels) {
  const int64_t k = routing.experts.size(1);
  if (use_kernels) {
    // The sort kernel: counts and rows in one pass per expert, then one copy
    // of the counts to the host (the reference syncs there too).
    const int64_t tokens = routing.experts.size(0), assignments = tokens * k;
    const auto options = routing.experts.options().dtype(at::kLong);
    const at::Tensor experts = routing.experts.to(at::kLong).reshape(-1).contiguous();
    at::Tensor total_counts = at::empty({num_experts}, options), kept = at::empty({num_experts}, options);
    at::Tensor token_index = at::empty({assignments}, options), row_assignment = at::empty({assignments}, options);
    at::Tensor row_of = at::full({assignments}, -1, options);
    const kernels::MoeSortArgs args{.experts = experts.const_data_ptr<int64_t>(),
                                    .tokens = tokens,
                                    .top_k = k,
                                    .num_experts = num_experts,
                                    .capacity = capacity ? *capacity : -1,
                                    .total_counts = total_counts.data_ptr<int64_t>(),
                                    .counts = kept.data_ptr<int64_t>(),
                                    .token_index = token_index.data_ptr<int64_t>(),
                                    .row_assignment = row_assignment.data_ptr<int64_t>(),
                                    .row_of = row_of.data_ptr<int64_t>()};
    if (kernels::cuda_slots().moe_sort(args, cuda_index_of(experts))) {
      const at::Tensor kept_host = kept.cpu();
      DispatchPlan plan;
      plan.counts.assign(kept_host.const_data_ptr<int64_t>(), kept_host.const_data_ptr<int64_t>() + num_experts);
      int64_t rows = 0;
      for (const int64_t c : plan.counts) rows += c;
      plan.dropped = assignments - rows;
      plan.token_index = token_index.narrow(0, 0, rows);
      // Gathered here, not in the kernel, so the router gets its gradient.
      plan.weight = routing.weights.reshape(-1).index_select(0, row_assignment.narrow(0, 0, rows));
      plan.row_of = row_of;
      plan.top_k = k;
      return plan;
    }
    // Refused (more experts than the kernel takes): the reference below.
  }
  at::Tensor flat_experts = routing.experts.reshape(-1);  // (N*k), assignment a = token * k + slot
  at::Tensor order = std::get<1>(at::sort(flat_experts, /*stable=*/true, 0, false));
  at::Tensor counts_t = at::bincount(flat_experts, {}, num_experts).cpu();
  std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + num_experts);
  DispatchPlan plan;
  if (capacity) {
    // Position of each sorted row inside its expert's segment; keep the first
    // `capacity`.
    std::vector<int64_t> starts(num_experts, 0);
    for (int64_t e = 1; e < num_experts; ++e) starts[e] = starts[e - 1] + counts[e - 1];
    at::Tensor sorted_experts = flat_experts.index_select(0, order);
    at::Tensor start_of = at::tensor(starts, order.options()).index_select(0, sorted_experts);
    at::Tensor position = at::arange(order.size(0), order.options()) - start_of;
    order = order.masked_select(position < *capacity);
    for (auto& c : counts) {
      const int64_t kept = std::min(c, *capacity);
      plan.dropped += c - kept;
      c = kept;
    }
  }
  plan.token_index = at::div(order, k, "floor");
  plan.weight = routing.weights.reshape(-1).index_select(0, order);
  plan.counts = std::move(counts);
  return plan;
}

at::Tensor combine(const at::Tensor& expert_out, const DispatchPlan& plan, int64_t tokens) {
  if (plan.row_of.defined()) {
    return CombineRows::apply(expert_out, plan.weight, plan.token_index, plan.row_of, plan.top_k, tokens);
  }
  at::Tensor weighted = (expert_out.to(at::kFloat) * plan.weight.unsqueeze(1)).to(expert_out.scalar_type());
  return at::zeros({tokens, expert_out.size(1)}, expert_out.options()).index_add(0, plan.token_index, weighted);
}

}  // namespace colossus::models::moe

namespace colossus::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A packed buffer as one differentiable tensor, without a copy: forward aliases
// the memory the parameters are views of; backward hands each parameter its
// rows of the gradient.
struct PackedWeights : torch::autograd::Function<PackedWeights> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& buffer, at::TensorList parts) {
    std::vector<int64_t> rows;
    for (const at::Tensor& part : parts) rows.push_back(part.size(0));
    ctx->saved_data["rows"] = rows;
    // A new tensor over the same storage, not an autograd view of `buffer`.
    return at::empty({0}, buffer.options())
        .set_(buffer.storage(), buffer.storage_offset(), buffer.sizes(), buffer.strides());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    variable_list out{at::Tensor()};
    if (!grads[0].defined()) {
      out.resize(rows.size() + 1);
      return out;
    }
    at::Tensor flat = grads[0].reshape({-1, grads[0].size(-1)});
    int64_t offset = 0;
    for (const int64_t r : rows) {
      out.push_back(flat.narrow(0, offset, r));
      offset += r;
    }
    return out;
  }
};

bool is_view_at(const at::Tensor& part, const at::Tensor& buffer, int64_t element_offset,
                at::IntArrayRef expected_sizes) {
  return part.defined() && part.device() == buffer.device() && part.scalar_type() == buffer.scalar_type() &&
         part.is_contiguous() && part.sizes() == expected_sizes &&
         part.const_data_ptr() ==
             static_cast<const char*>(buffer.const_data_ptr()) + element_offset * buffer.element_size();
}

}  // namespace

MixtralExpert::MixtralExpert(int64_t hidden_size, int64_t intermediate_size, const at::TensorOptions& options,
                             Names names)
    : LayerHost("MixtralBlockSparseTop2MLP"), names_(std::move(names)) {
  add_layer(names_.gate, std::make_shared<Linear>(hidden_size, intermediate_size, false, options));
  add_layer(names_.down, std::make_shared<Linear>(intermediate_size, hidden_size, false, options));
  add_layer(names_.up, std::make_shared<Linear>(hidden_size, intermediate_size, false, options));
}

at::Tensor MixtralExpert::forward(const at::Tensor& x) {
  return down().forward(at::silu(gate().forward(x)) * up().forward(x));
}

SparseMoeBlock::SparseMoeBlock(const MixtralConfig& config, const at::TensorOptions& options, int64_t first_expert,
                               int64_t local_experts)
    : LayerHost("MixtralSparseMoeBlock"),
      num_experts_(config.num_local_experts),
      top_k_(config.num_experts_per_tok),
      first_expert_(first_expert),
      local_experts_(local_experts < 0 ? config.num_local_experts : local_experts),
      norm_topk_prob_(config.norm_topk_prob),
      jitter_noise_(config.router_jitter_noise),
      capacity_factor_(config.capacity_factor) {
  config.validate();
  TORCH_CHECK(first_expert_ >= 0 && first_expert_ + local_experts_ <= num_experts_, "expert range [", first_expert_,
              ", ", first_expert_ + local_experts_, ") is outside the ", num_experts_, " experts");
  add_layer("gate", std::make_shared<Linear>(config.hidden_size, config.num_local_experts, false, options));
  experts_ = register_module("experts", std::make_shared<torch::nn::Module>("ExpertList"));
  const MixtralExpert::Names names = config.is_qwen_moe()
                                         ? MixtralExpert::Names{.gate = "gate_proj", .up = "up_proj", .down = "down_proj"}
                                         : MixtralExpert::Names{};
  for (int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) {
    experts_->register_module(
        std::to_string(e),
        std::make_shared<MixtralExpert>(config.hidden_size, config.expert_intermediate_size(), options, names));
  }
  if (config.shared_expert_intermediate_size > 0) {
    register_module("shared_expert", std::make_shared<MixtralExpert>(
                                         config.hidden_size, config.shared_expert_intermediate_size, options,
                                         MixtralExpert::Names{.gate = "gate_proj", .up = "up_proj", .down = "down_proj"}));
    add_layer("shared_expert_gate", std::make_shared<Linear>(config.hidden_size, 1, false, options));
  }
  pack_experts();
}

std::vector<at::Tensor> SparseMoeBlock::gate_up_parts() const {
  std::vector<at::Tensor> parts;
  for (int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) {
    parts.push_back(expert(e).gate().weight);
    parts.push_back(expert(e).up().weight);
  }
  return parts;
}

std::vector<at::Tensor> SparseMoeBlock::down_parts() const {
  std::vector<at::Tensor> parts;
  for (int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) parts.push_back(expert(e).down().weight);
  return parts;
}

void SparseMoeBlock::pack_experts() {
  gate_up_ = at::Tensor();
  down_ = at::Tensor();
  if (local_experts_ == 0) return;
  std::vector<at::Tensor> gate_up = gate_up_parts(), down = down_parts();
  const int64_t inner = gate_up[0].size(0), width = gate_up[0].size(1);
  at::NoGradGuard no_grad;
  at::Tensor gate_up_buffer = at::empty({local_experts_, 2 * inner, width}, gate_up[0].options());
  at::Tensor down_buffer = at::empty({local_experts_, width, inner}, down[0].options());
  for (int64_t l = 0; l < local_experts_; ++l) {
    at::Tensor w1 = gate_up_buffer[l].narrow(0, 0, inner), w3 = gate_up_buffer[l].narrow(0, inner, inner);
    w1.copy_(gate_up[2 * l]);
    w3.copy_(gate_up[2 * l + 1]);
    down_buffer[l].copy_(down[l]);
    // set_data keeps each parameter's identity (optimizer state, reducer hooks).
    gate_up[2 * l].set_data(w1);
    gate_up[2 * l + 1].set_data(w3);
    down[l].set_data(down_buffer[l]);
  }
  gate_up_ = gate_up_buffer;
  down_ = down_buffer;
}

bool SparseMoeBlock::grouped_gemm_ready() const {
  if (!grouped_gemm_enabled_ || !gate_up_.defined()) return false;
  const at::ScalarType dtype = gate_up_.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int64_t inner = down_.size(2), width = down_.size(1), element = gate_up_.element_size();
  // _grouped_mm wants every row stride a multiple of 16 bytes.
  if ((inner * element) % 16 != 0 || (width * element) % 16 != 0) return false;
  return packed_layout_intact();
}

bool SparseMoeBlock::packed_layout_intact() const {
  if (!gate_up_.defined() || local_experts_ == 0) return false;
  const int64_t inner = down_.size(2), width = down_.size(1);
  std::vector<at::Tensor> gate_up = gate_up_parts(), down = down_parts();
  for (int64_t l = 0; l < local_experts_; ++l) {
    if (!is_view_at(gate_up[2 * l], gate_up_, l * 2 * inner * width, {inner, width}) ||
        !is_view_at(gate_up[2 * l + 1], gate_up_, (l * 2 + 1) * inner * width, {inner, width}) ||
        !is_view_at(down[l], down_, l * width * inner, {width, inner})) {
      return false;
    }
  }
  return true;
}

at::Tensor SparseMoeBlock::run_local_experts(const at::Tensor& x, const std::vector<int64_t>& rows) {
  TORCH_CHECK(static_cast<int64_t>(rows.size()) == local_experts_, "run_local_experts: ", rows.size(),
              " row counts for ", local_experts_, " local experts");
  if (gate_up_.defined() && !packed_layout_intact()) {
    // Something re-pointed the parameters (a ZeRO bucket, a cast): the buffers
    // would only hold a stale second copy of the experts.
    gate_up_ = at::Tensor();
    down_ = at::Tensor();
  }
  last_ran_grouped_ = false;
  if (x.size(0) > 0 && x.scalar_type() == gate_up_.scalar_type() && x.device() == gate_up_.device() &&
      grouped_gemm_ready()) {
    last_ran_grouped_ = true;
    std::vector<int32_t> ends;
    int64_t total = 0;
    for (const int64_t r : rows) ends.push_back(static_cast<int32_t>(total += r));
    at::Tensor offsets = at::tensor(ends, at::kInt).to(x.device());
    const int64_t inner = down_.size(2);
    // The parts go in as an at::TensorList: autograd's ExtractVariables takes a
    // std::vector<at::Tensor> argument for a non-tensor (its catch-all template
    // hides the base's vector overload), so the parameters would silently get
    // no gradient (the training mismatch of the grouped path, root-caused).
    const std::vector<at::Tensor> gate_up_list = gate_up_parts(), down_list = down_parts();
    at::Tensor gate_up = PackedWeights::apply(gate_up_, at::TensorList(gate_up_list));  // (L, 2I, H)
    at::Tensor down = PackedWeights::apply(down_, at::TensorList(down_list));           // (L, H, I)
    at::Tensor h = at::_grouped_mm(x.contiguous(), gate_up.transpose(1, 2), offsets);  // (M, 2I): w1 x | w3 x
    at::Tensor activated = at::silu(h.narrow(1, 0, inner)) * h.narrow(1, inner, inner);
    return at::_grouped_mm(activated, down.transpose(1, 2), offsets);
  }
  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  for (int64_t l = 0; l < local_experts_; ++l) {
    outputs.push_back(expert(first_expert_ + l).forward(x.narrow(0, offset, rows[l])));
    offset += rows[l];
  }
  return at::cat(outputs, 0);
}

MixtralExpert& SparseMoeBlock::expert(int64_t global_index) const {
  TORCH_CHECK(global_index >= first_expert_ && global_index < first_expert_ + local_experts_, "expert ", global_index,
              " is not held here");
  auto* typed = dynamic_cast<MixtralExpert*>(experts_->named_children()[std::to_string(global_index)].get());
  TORCH_CHECK(typed != nullptr, "experts.", global_index, " has an unexpected type");
  return *typed;
}

at::Tensor SparseMoeBlock::run_experts(const at::Tensor& x_sorted, const std::vector<int64_t>& counts) {
  TORCH_CHECK(local_experts_ == num_experts_, "SparseMoeBlock holds experts [", first_expert_, ", ",
              first_expert_ + local_experts_, ") only; an expert-parallel block must override run_experts");
  return run_local_experts(x_sorted, counts);
}

at::Tensor SparseMoeBlock::forward(const at::Tensor& hidden) {
  const int64_t batch = hidden.size(0), seq = hidden.size(1), width = hidden.size(2);
  at::Tensor x = hidden.reshape({batch * seq, width});  // (N, H)
  if (is_training() && jitter_noise_ > 0) {
    x = x * at::empty_like(x).uniform_(1.0 - jitter_noise_, 1.0 + jitter_noise_);
  }
  at::Tensor logits = layer("gate").forward(x);  // (N, E)
  moe::Routing routing = moe::route(logits, top_k_, norm_topk_prob_);
  std::optional<int64_t> capacity;
  if (capacity_factor_) capacity = moe::expert_capacity(*capacity_factor_, x.size(0), top_k_, num_experts_);
  const bool kernels = dispatch_kernels_enabled_ && moe::dispatch_kernels_available(x);
  moe::DispatchPlan plan = moe::plan_dispatch(routing, num_experts_, capacity, kernels);
  at::Tensor y = run_experts(moe::permute(x, plan), plan.counts);  // (M, H)
  last_router_logits_ = logits;
  last_dropped_ = plan.dropped;
  at::Tensor out = moe::combine(y, plan, x.size(0));  // (N, H)
  if (has_shared_expert()) {
    // Qwen2-MoE: every token also through the shared expert, scaled by its sigmoid gate (on the
    // un-jittered input, as HF).
    at::Tensor flat = hidden.reshape({batch * seq, width});
    auto* shared = dynamic_cast<MixtralExpert*>(named_children()["shared_expert"].get());
    TORCH_CHECK(shared != nullptr, "shared_expert has an unexpected type");
    out = out + at::sigmoid(layer("shared_expert_gate").forward(flat)) * shared->forward(flat);
  }
  return out.view({batch, seq, width});
}

}  // namespace colossus::models
