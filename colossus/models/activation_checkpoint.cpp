#include "colossus/models/activation_checkpoint.h"

#include "colossus/core/errors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

namespace colossus::models {

namespace {

// Nested backwards (checkpoint reruns) running on this thread, and the
// callbacks queued inside them, waiting for the enclosing backward.
thread_local int rerun_depth = 0;
// Reruns of a forward in progress on this thread (in_checkpoint_rerun).
thread_local int rerun_forward_depth = 0;
thread_local std::vector<std::function<void()>> deferred_callbacks;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The forward's random streams, saved so a rerun draws the same dropout masks.
void save_rng(AutogradContext* ctx, const at::Tensor& input) {
  ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
  // Dropout on a GPU draws from that device's generator (philox seed and
  // offset): its state is saved too.
  if (input.device().type() != at::kCPU) {
    ctx->saved_data["device_rng"] = at::globalContext().defaultGenerator(input.device()).get_state();
  }
}

// Reruns `rerun(input)` with the saved random streams and a graph, then
// backpropagates grad_output through it as a nested backward whose
// callbacks go to the enclosing one; returns the input's gradient.
at::Tensor rerun_and_backward(AutogradContext* ctx, const at::Tensor& saved_input, const at::Tensor& grad_output,
                              const std::function<at::Tensor(const at::Tensor&)>& rerun) {
  at::Tensor input = saved_input.detach().requires_grad_(true);
  // Replay the forward's random draws (dropout), then restore the streams.
  auto generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor now = generator.get_state();
  generator.set_state(ctx->saved_data["rng"].toTensor());
  std::optional<at::Generator> device_generator;
  at::Tensor device_now;
  if (ctx->saved_data.count("device_rng") > 0) {
    device_generator = at::globalContext().defaultGenerator(input.device());
    device_now = device_generator->get_state();
    device_generator->set_state(ctx->saved_data["device_rng"].toTensor());
  }
  at::Tensor output;
  {
    at::AutoGradMode grad(true);
    ++rerun_forward_depth;
    try {
      output = rerun(input);
    } catch (...) {  // leave the depth and the random streams as they were
      --rerun_forward_depth;
      generator.set_state(now);
      if (device_generator) device_generator->set_state(device_now);
      throw;
    }
    --rerun_forward_depth;
  }
  generator.set_state(now);
  if (device_generator) device_generator->set_state(device_now);
  ++rerun_depth;
  const size_t deferred_before = deferred_callbacks.size();
  try {
    torch::autograd::backward({output}, {grad_output});
  } catch (...) {
    --rerun_depth;
    deferred_callbacks.resize(deferred_before);
    throw;
  }
  --rerun_depth;
  // Back in the enclosing backward: the callbacks queued in the rerun go
  // there (or wait for the next level out).
  std::vector<std::function<void()>> mine(deferred_callbacks.begin() + static_cast<std::ptrdiff_t>(deferred_before),
                                          deferred_callbacks.end());
  deferred_callbacks.resize(deferred_before);
  for (auto& callback : mine) queue_outer_backward_callback(std::move(callback));
  return input.grad();
}

// forward: block(hidden) without a graph; backward: rerun with a graph and
// backpropagate through it (parameter gradients accumulate there).
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, TransformerBlock* block,
                            const BlockContext* context) {
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    ctx->saved_data["layer"] = context->layer;
    // The RoPE tables (a sliding layer's own too, Gemma 3) and the document
    // mask of padded or packed rows; the backward's rerun needs them.
    const std::pair<const char*, const at::Tensor*> tables[] = {{"rope_cos", &context->rope_cos},
                                                                {"rope_sin", &context->rope_sin},
                                                                {"local_rope_cos", &context->local_rope_cos},
                                                                {"local_rope_sin", &context->local_rope_sin},
                                                                {"document_mask", &context->document_mask},
                                                                {"cu_seqlens", &context->varlen.cu_seqlens}};
    for (const auto& [name, table] : tables) {
      if (table->defined()) ctx->saved_data[name] = *table;
    }
    ctx->saved_data["max_seqlen"] = context->varlen.max_seqlen;
    save_rng(ctx, hidden);
    ctx->save_for_backward({hidden});
    at::NoGradGuard no_grad;
    return block->forward(hidden, *context);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* block = reinterpret_cast<TransformerBlock*>(ctx->saved_data["block"].toInt());
    BlockContext context;
    context.layer = ctx->saved_data["layer"].toInt();
    const std::pair<const char*, at::Tensor*> tables[] = {{"rope_cos", &context.rope_cos},
                                                          {"rope_sin", &context.rope_sin},
                                                          {"local_rope_cos", &context.local_rope_cos},
                                                          {"local_rope_sin", &context.local_rope_sin},
                                                          {"document_mask", &context.document_mask},
                                                          {"cu_seqlens", &context.varlen.cu_seqlens}};
    for (const auto& [name, table] : tables) {
      if (ctx->saved_data.count(name) > 0) *table = ctx->saved_data[name].toTensor();
    }
    context.varlen.max_seqlen = ctx->saved_data["max_seqlen"].toInt();
    at::Tensor grad = rerun_and_backward(ctx, ctx->get_saved_variables()[0], grad_outputs[0],
                                         [&](const at::Tensor& input) { return block->forward(input, context); });
    return {grad, at::Tensor(), at::Tensor()};
  }
};

// checkpoint_call's function: fn(input) without a graph, rerun in backward.
struct CheckpointCallFunction : public torch::autograd::Function<CheckpointCallFunction> {
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const Fn* fn) {
    ctx->saved_data["fn"] = reinterpret_cast<int64_t>(fn);
    save_rng(ctx, input);
    ctx->save_for_backward({input});
    at::NoGradGuard no_grad;
    return (*fn)(input);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto* fn = reinterpret_cast<const Fn*>(ctx->saved_data["fn"].toInt());
    return {rerun_and_backward(ctx, ctx->get_saved_variables()[0], grad_outputs[0], *fn), at::Tensor()};
  }
};

}  // namespace

bool in_checkpoint_rerun() { return rerun_forward_depth > 0; }

void queue_outer_backward_callback(std::function<void()> callback) {
  if (rerun_depth > 0) {
    deferred_callbacks.push_back(std::move(callback));
  } else {
    torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
  }
}

CheckpointedBlock::CheckpointedBlock(std::shared_ptr<TransformerBlock> inner)
    : TransformerBlock("CheckpointedBlock"), inner_(std::move(inner)) {
  if (!inner_) throw ConfigError("CheckpointedBlock: the block is null");
  for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
}

at::Tensor CheckpointedBlock::forward(const at::Tensor& hidden, const BlockContext& context) {
  // Nothing to save without a graph; an input outside the graph would cut the
  // parameters off (the function's output needs a differentiable input).
  if (!at::GradMode::is_enabled() || context.attention != nullptr || !hidden.requires_grad()) {
    return inner_->forward(hidden, context);
  }
  return CheckpointFunction::apply(hidden, inner_.get(), &context);
}

at::Tensor checkpoint_call(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input) {
  if (!at::GradMode::is_enabled() || !input.requires_grad()) return fn(input);
  return CheckpointCallFunction::apply(input, &fn);
}

CheckpointGranularity parse_checkpoint_granularity(const std::string& name) {
  if (name == "full") return CheckpointGranularity::Full;
  if (name == "mlp") return CheckpointGranularity::Mlp;
  throw ConfigError(fmt::format(
      "gradient_checkpointing_granularity = '{}': use 'full' (a checkpointed block reruns whole) or 'mlp' (only its "
      "MLP reruns; attention's activations are kept)",
      name));
}

const char* checkpoint_granularity_name(CheckpointGranularity granularity) {
  return granularity == CheckpointGranularity::Mlp ? "mlp" : "full";
}

int64_t enable_activation_checkpointing(CausalLM& model, double ratio, CheckpointGranularity granularity) {
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    throw ConfigError(fmt::format(
        "gradient_checkpoint_config: gradient_checkpointing_ratio = {} must be in [0, 1]; use 1.0 (every block)",
        ratio));
  }
  const auto n = static_cast<int64_t>(model.blocks().size());
  const auto count = static_cast<int64_t>(std::llround(ratio * static_cast<double>(n)));
  for (int64_t i = 0; i < count; ++i) {
    const auto& block = model.blocks()[static_cast<size_t>(i)];
    if (std::dynamic_pointer_cast<CheckpointedBlock>(block)) continue;
    if (granularity == CheckpointGranularity::Full) {
      model.replace_block(static_cast<size_t>(i), std::make_shared<CheckpointedBlock>(block));
    } else if (!block->checkpoint_mlp()) {
      throw ConfigError(fmt::format(
          "gradient_checkpointing_granularity = 'mlp': block {} ({}) has no dense MLP to rerun (mixture-of-experts "
          "blocks); use 'full'",
          i, block->name()));
    }
  }
  return count;
}

}  // namespace colossus::models
