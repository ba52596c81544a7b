// Lazy init: a model built on the meta device (shapes, no storage), whose
// parameters are materialised later from a ParamSource, either whole
// (materialize) or only where a sharding plugin keeps them (Gemini builds each
// rank's chunk shards straight from the source, so no rank allocates the full
// model). Sources are deterministic per parameter: seeded init gives exactly
// the eager init_weights values, a checkpoint its mapped tensors.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"

namespace colossus::models {

// The whole values of one parameter (name as in named_parameters, its meta
// tensor for the shape): a CPU tensor of that shape, any floating dtype.
using ParamSource = std::function<at::Tensor(const std::string& name, const at::Tensor& param)>;

// create_model on the meta device, not initialised: nothing is allocated.
std::shared_ptr<CausalLM> create_lazy_model(const ModelConfig& config);
bool is_lazy(const CausalLM& model);  // any parameter on the meta device

// init_weights(seed)'s value of each parameter, one parameter at a time.
ParamSource seeded_source(std::shared_ptr<const CausalLM> model, uint64_t seed);
// The tensors of a Hugging Face directory (single file or shards + index,
// e.g. a per-rank sharded checkpoint), mapped: only the pages a rank copies
// are read. Names and shapes are checked against the model here (CheckpointError).
ParamSource checkpoint_source(const CausalLM& model, const std::string& dir);

// Points `param` (a meta parameter) at `value`'s storage in place: modules,
// optimizers and maps holding the parameter see the real tensor (set_data
// refuses a meta -> real change; the identity is what matters here).
void rebind_parameter(const at::Tensor& param, const at::Tensor& value);

// Materialises every meta parameter of `model` whole on `device` in `dtype`
// (floating parameters): for plugins that replicate the model (DDP).
void materialize(CausalLM& model, const ParamSource& source, c10::Device device = c10::kCPU,
                 c10::ScalarType dtype = at::kFloat);

}  // namespace colossus::models
