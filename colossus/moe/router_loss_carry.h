// The Mixtral router losses under pipeline parallelism: each stage adds its
// layers' router statistics to a small vector carried with the hidden state,
// and the last stage computes the losses from the totals, exactly the
// single-process formulas (MixtralForCausalLM::add_router_losses over every
// layer). Carried to the last stage, not summed per stage: the load-balancing
// loss multiplies token counts and router probabilities each summed over
// all layers, so it does not split into per-stage terms.
#pragma once
#include "colossus/booster/hybrid_parallel_pipeline.h"
#include "colossus/models/mixtral.h"

namespace colossus::moe {

// Carried per microbatch (fp32, 2E + 2 values): tokens routed to each expert
// (E, no gradient), router probabilities summed over rows (E), the summed
// squared log-sum-exp of the router logits (z-loss), and the rows counted.
// finish adds router_aux_loss_coef x E x sum_e (count_e / rows)(prob_e / rows)
// (with output_router_logits) and router_z_loss_coef x z / rows, each divided
// by the number of microbatches, so the schedule's total is the criterion's
// plus the mean router loss over microbatches: what gradient accumulation
// over the same microbatches gives without a pipeline.
booster::HybridPipeline::PipelineCarry router_loss_carry(const models::MixtralForCausalLM& model);

}  // namespace colossus::moe
