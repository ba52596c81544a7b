// GeminiDDP: ZeRO-3 over chunks. The model's trainable parameters become views
// of per-chunk buffers (chunk_plan.h) whose storage is allocated only while a
// part of the model that uses the chunk runs: each dp rank keeps its shard of
// every chunk (on the device or offloaded to host memory, placement.h), the
// whole chunk is all-gathered before the segment that needs it and its storage
// freed after (storage resized to zero in place, so autograd's saved views of
// the parameters see the data again when backward re-gathers it).
//
// Segments: 0 = embedding, 1..L = the blocks (each wrapped by a GeminiBlock),
// L+1 = final norm + head (tied embedding included). Forward gathers a
// segment's chunks before it runs; a hook on the segment's output gathers them
// again before its backward. Gradients are copied into a chunk-sized buffer
// by post-accumulate-grad hooks and reduce-scattered (averaged over dp) as soon
// as a chunk's last gradient arrived; each rank accumulates its part in an
// fp32 gradient shard next to its fp32 master shard (GeminiOptimizer steps
// them).
#pragma once
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "colossus/amp/loss_scaler.h"
#include "colossus/cluster/process_group.h"
#include "colossus/metrics/memory.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/lazy_init.h"
#include "colossus/zero/gemini/chunk_plan.h"
#include "colossus/zero/gemini/placement.h"

namespace colossus::zero::gemini {

class HostWorker;  // host_worker.h

struct GeminiOptions {
  std::string placement_policy = "static";  // "static" or "auto"
  // static: fraction of chunks sharded (the rest stay gathered), and of the
  // sharded chunks whose optimizer side / parameter shard live on the host.
  double shard_param_frac = 1.0;
  double offload_optim_frac = 0.0;
  double offload_param_frac = 0.0;
  // auto: the share of device memory assumed non-model during the warm-up
  // step, and the share of capacity chunks may use after it (Colossal-AI's
  // keys). The warm-up traces the true peak of every segment (the probe's
  // peak, reset at each boundary), and the first step places chunks by it:
  // parameter shards, then optimizer shards, into what the cap leaves after
  // the working set and the measured non-model peak plus
  // kNonModelHeadroom of it (placement.h).
  double warmup_non_model_data_ratio = 0.8;
  double steady_cuda_cap_ratio = 0.9;
  // auto: unset (the default), optimizer shards take all of that margin;
  // set, they take this share of it, as Colossal-AI's key (the share of the
  // device memory the traced warm-up left free that fp32 optimizer shards
  // may use; its default 0.0 keeps every optimizer shard on the host, which
  // ran at 0.04x the plain step, issue 27). Before the peak was traced, a
  // hand-tuned 0.5 stood in for what the boundaries' samples missed.
  std::optional<double> gpu_margin_mem_ratio = std::nullopt;
  std::string precision = "fp16";             // parameter dtype: fp16 (loss-scaled, Colossal-AI's default), bf16, fp32
  bool master_weights = true;                 // fp32 master shards (false: step the bf16/fp16 shard itself)
  bool pin_memory = false;                    // host shards in pinned memory (CUDA only)
  int max_prefetch = 0;                       // chunks all-gathered ahead of the segment that needs them
  bool enable_gradient_accumulation = false;  // several backwards per step sum into the gradient shards
  ChunkSearchOptions chunk_search = {};
  // Colossal-AI's GeminiPlugin defaults: 2^16 to start, at most 2^32.
  amp::LossScalerOptions loss_scaler = {.initial_scale = 65536.0, .max_scale = 4294967296.0};
  double max_norm = 0.0;
  double norm_type = 2.0;
  // Device memory figures for the auto policy (default:
  // metrics::device_memory()), and the reset of its peak_allocated_bytes
  // (default: metrics::reset_device_memory_peak()). A probe given without a
  // reset is sampled at the segment boundaries only.
  std::function<std::optional<metrics::DeviceMemory>()> memory_probe = {};
  std::function<void()> memory_peak_reset = {};
  // auto: the host bytes this rank's optimizer sides may use (0: no limit);
  // where the ratio above would leave more than that on the host, more go to
  // the device (placement.h). Default: 85% of the machine's memory (the rest
  // for the system, the process and its data) over the ranks on this host.
  std::function<int64_t()> host_budget_probe = {};
  // Lazy init: the whole values of a parameter the model holds on the meta
  // device (models::seeded_source / checkpoint_source); each rank copies only
  // its shard out of them, one parameter at a time.
  models::ParamSource param_source = {};
  // NVMe offload (static placement): this share of the chunks whose optimizer
  // side is on the host keep their optimizer state (moments) in files under
  // nvme_offload_dir between steps (GeminiOptimizer, nvme_store.h).
  double nvme_offload_fraction = 0.0;
  std::string nvme_offload_dir = "";
  // Those files are read and written with O_DIRECT from aligned buffers the
  // store keeps between steps; a filesystem that refuses O_DIRECT gets
  // buffered IO (one logged line). false: buffered IO from the start.
  bool nvme_direct_io = true;
  // Gradients reduce-scattered and sharded chunks all-gathered for forward
  // and backward in FP8 e4m3, one scale a chunk and rank
  // (cluster/fp8_collectives.h; blocking, so max_prefetch overlaps nothing).
  // The shards and masters stay exact: only the gathered copies the model
  // computes with are e4m3 roundings, the same on every rank. Chunks kept
  // gathered (shard_param_frac < 1) and checkpoint gathers stay in the
  // parameters' dtype. Not with fp16 (GeminiPluginOptions::validate).
  bool fp8_communication = false;
};

// One chunk on this rank.
struct Chunk {
  BucketLayout layout;  // params in packing order, numel, shard_numel, dtype
                        // (the parameters')
  ChunkPlacement placement;
  at::Tensor full;         // (numel) parameter dtype on the device; storage empty
                           // unless gathered
  at::Tensor shard;        // (shard_numel) parameter dtype; a view of `full` when kept
                           // gathered
  at::Tensor master;       // (shard_numel) master dtype; may alias `shard`
  at::Tensor grad_shard;   // (shard_numel) master dtype: this rank's averaged gradient
  at::Tensor grad_full;    // (numel) parameter dtype, while its gradients arrive
                           // in backward
  at::Tensor reduced;      // (shard_numel) reduce-scatter output in flight
  // The host step (GeminiDDP::enable_host_step): (shard_numel) bf16, pinned
  // on CUDA, in place of grad_shard. Backward's reduced gradient lands here;
  // the CPU Adam writes the new parameters over it, which go back to `shard`.
  at::Tensor host_io;
  std::optional<c10::Event> host_io_landed;  // CUDA: recorded after the copy into host_io
  // The host step with gradient accumulation: (shard_numel) fp32 on the host,
  // the sum of the micro-batches' gradients (HostWorker adds each host_io
  // into it as it lands).
  at::Tensor host_grad;
  at::Tensor gather_send;  // the all-gather's input in flight
  cluster::Work gather_work, reduce_work;
  enum class State { Released, Gathering, Gathered } state = State::Released;
  size_t grads_pending = 0;
  bool reduce_launched = false;
};

// Bytes this rank holds, by kind and place (on CPU ranks both places are the
// same memory: the split is the placement's accounting).
struct GeminiMemory {
  int64_t params_device = 0, params_host = 0;  // shards + gathered chunks
  int64_t grads_device = 0,
          grads_host = 0;  // gradient shards + in-flight buffers
  int64_t masters_device = 0,
          masters_host = 0;  // master shards not aliasing the parameter shard
  int64_t optim_device = 0,
          optim_host = 0;  // optimizer state (filled by GeminiOptimizer)
  int64_t optim_nvme = 0;  // optimizer state in NVMe offload files, in neither total
  int64_t nvme_buffers_host = 0;  // the NVMe tier's IO buffers, kept between steps (filled by GeminiOptimizer)
  int64_t device_total() const { return params_device + grads_device + masters_device + optim_device; }
  int64_t host_total() const { return params_host + grads_host + masters_host + optim_host + nvme_buffers_host; }
};

class GeminiDDP {
 public:
  // `model`: fp32, the same values on every rank (any device; chunks are built
  // on `device` / the host), or lazy (parameters on the meta device, values
  // from options.param_source). Its blocks are replaced by GeminiBlock wrappers.
  GeminiDDP(std::shared_ptr<models::CausalLM> model, cluster::ProcessGroupPtr dp_group, c10::Device device,
            GeminiOptions options);
  ~GeminiDDP();
  GeminiDDP(const GeminiDDP&) = delete;
  GeminiDDP& operator=(const GeminiDDP&) = delete;

  // input_ids: (B, T) int64 -> logits (B, T, V); every chunk released
  // afterwards.
  at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {});
  // The loss with the head fused into it (CausalLM::head_loss), through the
  // same chunk schedule: what DDP's and ZeRO's forward_loss compute, to the
  // bit, and no (B, T, V) logits.
  at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels, std::optional<int64_t> num_items,
                          const models::TokenLayout& layout);
  models::CausalLM& model() { return *model_; }

  // Segment boundaries (GeminiBlock calls them for segments 1..L).
  void pre_forward(size_t segment);
  void post_forward(size_t segment, const at::Tensor& output);
  void pre_backward(size_t segment);
  // Called by the hooks and the autograd-engine callback.
  void on_grad_ready(size_t param_index);
  void finish_backward();
  // Booster::no_sync: only allowed with enable_gradient_accumulation (each
  // backward is reduced anyway; the shards sum).
  void set_grad_sync(bool enabled);

  // The optimizer side.
  const GeminiOptions& options() const { return options_; }
  const NamedParams& params() const { return params_; }
  const Layout& layout() const { return layout_; }
  std::vector<Chunk>& chunks() { return chunks_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  // The master view of parameter k (its own part; empty if none) with .grad a
  // view of the gradient shard.
  const at::Tensor& master_view(size_t param_index) const { return master_views_[param_index]; }
  c10::ScalarType master_dtype() const { return master_dtype_; }
  c10::ScalarType dtype() const { return dtype_; }  // the parameters' (precision)
  cluster::ProcessGroupPtr dp_group() const { return dp_group_; }
  c10::Device device() const { return device_; }
  // After the optimizer stepped the masters: parameter shards follow them
  // (kept-gathered chunks all-gathered again); the next backward overwrites the
  // gradient shards.
  void after_step();
  // Parameter shards (and kept-gathered chunks) take the masters' values;
  // collective over dp.
  void shards_from_masters();
  // ZeRO-Offload's step for chunks whose optimizer side is on the host, with
  // bf16 parameters and fp32 masters (GeminiOptimizer turns it on for
  // HybridAdam): no fp32 gradient shard on the host (2 bytes a parameter
  // there, not 4). During backward, one chunk behind its reduce, each
  // chunk's gradient norm term and finiteness are taken on the device and
  // its reduced bf16 gradient is copied into host_io; the statistics follow
  // at the end of backward. The optimizer queues chunk i's update behind its
  // copy; the new shard goes back up when the next forward gathers chunk i.
  // With enable_gradient_accumulation each landed copy is summed into the
  // chunk's fp32 host_grad by a worker thread (6 bytes a parameter on the
  // host, the sums off the GPU's path), the statistics of those chunks are
  // taken on the host from the sums, and the CPU Adam reads them.
  // The CPU Adam runs on that worker too (queue_host_update), chunk by chunk
  // in the order the next forward needs them; the forward waits for a chunk
  // only when it gathers it, so the update overlaps the forward.
  void enable_host_step();
  bool host_step_enabled() const { return host_step_; }
  bool host_steps(const Chunk& chunk) const {
    return host_step_ && chunk.placement.optim_on_host && !chunk.placement.keep_gathered;
  }
  // The statistics of the last backward, one entry a chunk (host-step mode):
  // ||g||_p (fp32; 0 when max_norm is 0) and whether g is finite. Waits only
  // for them, not for the gradients' copies.
  struct GradStats {
    std::vector<float> norms;
    std::vector<bool> finite;
  };
  GradStats grad_stats();
  // Waits until chunk c's reduced gradient is in host_io (with gradient
  // accumulation: summed into host_grad).
  void wait_host_gradient(size_t chunk);
  // The host step's CPU update of a chunk (the optimizer's), run by the
  // worker once the chunk's gradient has landed; it writes the new bf16
  // parameters into host_io. They go up when something next needs the chunk:
  // its gather (the next forward), its next gradient copy, a checkpoint or
  // finish_host_updates().
  void queue_host_update(size_t chunk, std::function<void()> update);
  // Waits for the chunk's host work and queues the copy of its new
  // parameters into its shard (the work after it on the stream is ordered
  // behind); every chunk's.
  void finish_host_update(size_t chunk);
  void finish_host_updates();
  // Waits for the worker alone (the copies up stay pending).
  void wait_host_work();
  // Chunks in the order the forward first gathers them (the order to update
  // them in), then any it never gathers.
  const std::vector<size_t>& forward_order() const { return forward_order_; }

  // Auto policy: ends the warm-up at the first step (places chunks by the
  // traced peak); no-op after.
  void end_warmup(int64_t optim_bytes_per_element);
  bool warming_up() const { return warming_up_; }
  int64_t peak_non_model_bytes() const { return peak_non_model_bytes_; }
  // Moves chunks to a new placement (before the optimizer has state on them).
  void apply_placement(const std::vector<ChunkPlacement>& placement);

  // Materialises every chunk (collective), calls fn, releases them again
  // (checkpoints).
  void with_all_gathered(const std::function<void()>& fn);
  // The parameters were overwritten in full (all gathered): shards and masters
  // follow (not collective).
  void refresh_from_params();
  // Gathers one chunk at a time (collective), calls fn(chunk index) while it
  // is whole and releases it: a save that never holds more than one chunk.
  void for_each_gathered(const std::function<void(size_t)>& fn);
  // Loads every parameter from whole(name) (e.g. a mapped checkpoint), one
  // chunk at a time and without communication: the chunk's storage is made,
  // filled, this rank's shard and master take their part, and it is released
  // again. Frozen parameters are copied as they are.
  void load_params(const std::function<at::Tensor(const std::string&)>& whole);

  GeminiMemory memory_bytes() const;
  int64_t device_model_bytes() const;
  int64_t chunk_numel() const { return chunk_numel_; }
  const std::vector<std::vector<size_t>>& segment_chunks() const { return segment_chunks_; }
  // Chunks gathered so far (forward and backward; counts re-gathers), and the
  // most gathered at once.
  int64_t gathers() const { return gathers_; }
  int64_t max_gathered() const { return max_gathered_; }

 private:
  // Embedding, blocks and final norm under the chunk schedule, then `head`
  // on the normed hidden states (logits or the fused loss) as the last segment.
  at::Tensor run_segments(const at::Tensor& input_ids, const models::TokenLayout& layout,
                          const std::function<at::Tensor(const at::Tensor&)>& head);
  // in_fp8: the training gathers under fp8_communication; checkpoints and
  // loads gather in the parameters' dtype.
  void gather(size_t chunk, bool in_fp8 = false);
  void wait_gathered(size_t chunk);
  void release(size_t chunk);
  void release_all();
  void schedule(size_t segment, bool forward);
  void start_backward();
  void launch_reduce(size_t chunk);
  // Waits for the chunk's reduce and takes its part: into the gradient
  // shard, or (host step) its statistics and the copy into host_io.
  void settle(size_t chunk);
  // The auto policy's warm-up trace: sample_memory() ends the stretch of the
  // step since the last boundary, taking its peak non-model bytes (the
  // probe's peak less the model bytes then); start_memory_period() resets
  // the peak and notes the model bytes at the start of the next stretch.
  void sample_memory();
  void start_memory_period();
  c10::Device place_of(bool on_host) const;
  at::Tensor host_or_device(const at::Tensor& values, bool on_host, c10::ScalarType dtype) const;
  at::Tensor whole_values(size_t param_index) const;  // the model's tensor, or param_source's for a meta one
  void point_views(size_t chunk);
  // The constructor's steps.
  std::vector<ChunkPlacement> initial_placement(size_t num_chunks, int dp);
  void materialise_chunks(const std::vector<ChunkPlacement>& placement, int rank);
  void move_unmanaged_to_device();
  void refresh_chunk(size_t chunk);  // shard and master from the gathered chunk
  // Host-step mode: host_io for the chunks it covers, grad_shard for the
  // rest, moving a pending gradient across when a chunk changes sides.
  void arrange_host_io();
  // Host step (gemini_host_step.cpp): a settled chunk's norm term and
  // finiteness into grad_stats_device_; a host-step chunk's statistics and
  // the copy of its reduced gradient into host_io; at the end of backward
  // the statistics to the host.
  void record_chunk_stats(size_t chunk, const at::Tensor& grad);
  void send_to_host(size_t chunk);
  void send_grad_stats();
  // Queues the copy of host_io (the new bf16 parameters) into the chunk's
  // shard; the work after it on the stream is ordered behind.
  void upload_host_step(size_t chunk);
  void copy_shards_from_masters(bool skip_host_step);

  std::shared_ptr<models::CausalLM> model_;
  cluster::ProcessGroupPtr dp_group_;
  c10::Device device_;
  GeminiOptions options_;
  NamedParams params_;
  Layout layout_;
  int64_t chunk_numel_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<at::Tensor> master_views_;
  c10::ScalarType dtype_, master_dtype_;
  std::vector<std::vector<size_t>> segment_chunks_;
  std::vector<bool> ready_;
  bool in_backward_ = false;
  bool grads_pending_step_ = false;  // a backward finished since the last step
  bool warming_up_ = false;
  bool host_step_ = false;
  std::optional<size_t> unsettled_;  // the chunk whose reduce was launched last, not yet settled
  at::Tensor grad_stats_device_;   // (2 x chunks) fp32: norms, then finite flags
  at::Tensor grad_stats_host_;     // its copy, pinned on CUDA
  std::optional<c10::Event> grad_stats_landed_;
  // CUDA: the stream the host step's gradient copies run on, so backward's
  // kernels do not queue behind them.
  std::optional<c10::Stream> copy_stream_;
  std::vector<size_t> forward_order_;
  std::vector<char> upload_pending_;  // per chunk: an update whose parameters have not gone up
  // The host step's worker; after chunks_, so it is destroyed (its queue
  // drained) before them.
  std::unique_ptr<HostWorker> host_worker_;
  int64_t peak_non_model_bytes_ = 0;
  std::optional<int64_t> period_model_bytes_;  // the model bytes when the traced stretch began
  int64_t gathers_ = 0, max_gathered_ = 0;
};

// A block whose parameters live in chunks: gathers them around its forward
// (and, through a hook on its output, before its backward). It adopts the
// wrapped block's children, so parameter names stay Hugging Face's.
class GeminiBlock : public models::TransformerBlock {
 public:
  GeminiBlock(std::shared_ptr<models::TransformerBlock> inner, GeminiDDP* ddp, size_t segment);
  // hidden: (B, T, C) -> (B, T, C)
  at::Tensor forward(const at::Tensor& hidden, const models::BlockContext& context) override;
  const std::shared_ptr<models::TransformerBlock>& inner() const { return inner_; }

 private:
  std::shared_ptr<models::TransformerBlock> inner_;
  GeminiDDP* ddp_;
  size_t segment_;
};

}  // namespace colossus::zero::gemini
