// `colossus serve PATH`: an OpenAI-compatible HTTP server over one
// InferenceEngine (see colossus/inference/serving/server.h). One process, or
// with --tensor_parallel_size N the engine split over N ranks that this
// command starts itself (rank 0 serves HTTP, the others follow its steps);
// SIGINT/SIGTERM stop it gracefully.
#include "colossus/cli/commands.h"
#include "colossus/cli/inference_common.h"
#include "colossus/core/errors.h"
#include "colossus/inference/engine/inference_config.h"

#include <fmt/format.h>

#ifdef COLOSSUS_WITH_SERVER
#include "colossus/cluster/launch.h"
#include "colossus/core/env.h"
#include "colossus/inference/model_dir.h"
#include "colossus/inference/serving/server.h"
#include "colossus/inference/serving/tensor_parallel_steps.h"
#include "colossus/launcher/child_process.h"
#include "colossus/launcher/net.h"
#include "colossus/launcher/run_job.h"
#include "colossus/models/config.h"
#include "colossus/models/pretrained.h"

#include <c10/util/Exception.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#endif

namespace colossus::cli {

namespace {

struct ServeArgs {
  std::string path;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  std::string tokenizer;
  std::string lora;  // --lora: a PEFT adapter to merge in
  std::string device = "auto";
  std::string dtype = "auto";
  std::string use_cuda_graph = "auto";
  int threads = 0;
  int max_connections = 0;
  double request_timeout = 10;
  bool quiet = false;
  std::string api_key;
  std::vector<std::string> allowed_origins;
  inference::InferenceConfig config{};
  double gpu_memory_utilization = 0.9;  // vLLM's default
  int tensor_parallel_size = 1;         // ranks the engine is split over (one GPU each)
  int64_t max_model_len = 0;            // vLLM's: prompt + output tokens a request may span; 0 = the model's context
  // Whether these were given: unset, they take vLLM-style defaults from the
  // model and the device (serve_config).
  const CLI::Option* max_input_len_option = nullptr;
  const CLI::Option* max_output_len_option = nullptr;
  const CLI::Option* max_batch_size_option = nullptr;
  const CLI::Option* max_num_batched_tokens_option = nullptr;
  const CLI::Option* max_context_len_to_capture_option = nullptr;
  const CLI::Option* gpu_memory_utilization_option = nullptr;
  const CLI::Option* kv_cache_memory_fraction_option = nullptr;
};

constexpr const char* kFooter = R"(PATH is a Hugging Face model directory, a checkpoint step directory, or a
run/checkpoints directory (as for `colossus generate`).

Endpoints (OpenAI's wire format):
  POST /v1/completions        prompt (text, token ids, or a list of them), max_tokens, n,
                              temperature, top_p, top_k, seed, stop, repetition_penalty,
                              presence_penalty, frequency_penalty, no_repeat_ngram_size,
                              ignore_eos, logprobs (0-20), echo, stream
  POST /v1/chat/completions   messages, through the model directory's chat template;
                              logprobs + top_logprobs
  GET  /v1/models             the served model
  POST /tokenize, /detokenize vLLM's: prompt or messages -> token ids; token ids -> text
  GET  /health                200 once the model is loaded
  GET  /metrics               Prometheus text: vLLM's vllm:* names (requests, KV cache usage,
                              tokens, TTFT / TPOT / e2e histograms) and colossus:* ones

A request's unset sampling fields take this server's defaults (--do_sample,
--temperature, ...; greedy unless --do_sample); temperature 0 is greedy.
max_tokens defaults to what fits (max_output_len and the model's context).

Tensor parallelism (--tensor_parallel_size N, -tp N): this command starts N
ranks of itself as `colossus run -n N` would (NCCL, one GPU each; on the CPU
under mpirun), each loading the model and keeping its 1/N share; rank 0 serves
HTTP and broadcasts each step's new requests, aborts and stop to the others,
whose engines step in lockstep. Lines are prefixed [rN]; SIGINT/SIGTERM stop
every rank (rank 0 drains first), and the command reports the signal as
`colossus run` does. Under `colossus run -n N` or mpirun it serves as one rank.

Examples:
  colossus serve ./gpt2 --port 8000
  colossus serve ./llama-8b --tensor_parallel_size 2
  curl localhost:8000/v1/completions -H 'Content-Type: application/json' \
       -d '{"model": "gpt2", "prompt": "Hello", "max_tokens": 16, "temperature": 0}')";

// vLLM's serving defaults where the engine's own are sized for `generate`.
constexpr int64_t kGpuMaxNumSeqs = 256;           // vLLM's max_num_seqs
constexpr int64_t kMaxNumBatchedTokens = 8192;     // vLLM's chunked-prefill step budget on large GPUs
constexpr int64_t kMaxContextLenToCapture = 8192;  // vLLM's max_seq_len_to_capture

#ifdef COLOSSUS_WITH_SERVER
// This command line, to start it again as each rank: /proc/self/cmdline with
// the executable's own path first.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  if (argv.empty()) throw LaunchError("cannot read this process's command line from /proc/self/cmdline");
  argv[0] = launcher::self_executable();
  return argv;
}

bool given(const CLI::Option* option) { return option != nullptr && option->count() > 0; }

struct ServeSettings {
  inference::InferenceConfig config;
  int64_t max_model_len = 0;  // what /v1/models advertises and every request must fit in
};

// The engine's config from the flags and the model's config.json, checked
// before anything loads.
ServeSettings serve_config(const ServeArgs& args, const c10::Device& device, const std::string& model_dir) {
  inference::InferenceConfig config = args.config;
  // vLLM's defaults: the GPU when there is one, the model's own dtype there,
  // decode steps replayed from CUDA graphs on it (not under tensor
  // parallelism, which the graphs do not cover).
  config.dtype = resolve_dtype(args.dtype, model_dir, device);
  config.tp_size = args.tensor_parallel_size;
  config.use_cuda_graph = args.use_cuda_graph == "auto" ? device.is_cuda() && config.tp_size == 1
                                                        : args.use_cuda_graph == "true";
  if (config.use_cuda_graph && !device.is_cuda()) {
    throw ConfigError(fmt::format("--use_cuda_graph true needs a GPU; the device is {} (leave it auto)", device.str()));
  }
  if (config.use_cuda_graph && config.tp_size > 1) {
    throw ConfigError(fmt::format("--use_cuda_graph true does not combine with --tensor_parallel_size {}: the engine "
                                  "replays no graphs under tensor parallelism (leave it auto)",
                                  config.tp_size));
  }
  // The KV pool's memory: vLLM's gpu_memory_utilization, unless the older
  // kv_cache_memory_fraction (a share of the free memory) was asked for.
  if (args.kv_cache_memory_fraction_option->count() > 0 && args.gpu_memory_utilization_option->count() > 0) {
    throw ConfigError(fmt::format("--gpu_memory_utilization {} and --kv_cache_memory_fraction {} both size the KV cache; "
                                  "give one (gpu_memory_utilization: a share of the GPU's total memory for everything)",
                                  args.gpu_memory_utilization, config.kv_cache_memory_fraction));
  }
  if (args.kv_cache_memory_fraction_option->count() == 0) config.gpu_memory_utilization = args.gpu_memory_utilization;

  // Lengths as vLLM's: a request may span the model's whole context (or
  // --max_model_len), prompt and output together; the flags that bound each
  // part alone only narrow that.
  const int64_t context = models::max_positions(models::read_config((std::filesystem::path(model_dir) / "config.json").string()));
  if (args.max_model_len < 0 || args.max_model_len == 1 || args.max_model_len > context) {
    throw ConfigError(fmt::format("--max_model_len {} is not in [2, {}] (the model's context); leave it unset for {}",
                                  args.max_model_len, context, context));
  }
  const int64_t model_len = args.max_model_len > 0 ? args.max_model_len : context;
  if (!given(args.max_input_len_option)) config.max_input_len = model_len - 1;
  if (!given(args.max_output_len_option)) config.max_output_len = model_len - 1;
  if (config.max_input_len >= model_len) {
    throw ConfigError(fmt::format("--max_input_len {} leaves no room to generate within max_model_len {}; use at most {}",
                                  config.max_input_len, model_len, model_len - 1));
  }
  // Concurrency, the step's token budget and the graphs' reach as vLLM's on
  // a GPU; the CPU keeps the engine's small batch (its KV pool is sized by it).
  if (device.is_cuda() && !given(args.max_batch_size_option)) config.max_batch_size = kGpuMaxNumSeqs;
  if (!given(args.max_num_batched_tokens_option)) {
    config.max_num_batched_tokens = std::max(std::min(kMaxNumBatchedTokens, config.max_input_len), config.max_batch_size);
  }
  if (!given(args.max_context_len_to_capture_option)) {
    config.max_context_len_to_capture = std::min(kMaxContextLenToCapture, model_len);
  }
  config.validate();
  return {.config = config, .max_model_len = model_len};
}

// `colossus serve --tensor_parallel_size N` started alone: checks what can be
// checked here, then runs this same command line as N ranks the way `colossus
// run -n N` does (one per GPU with NCCL, else CPU ranks under mpirun), and
// supervises them: output prefixed [rN], a failing rank stops the others,
// SIGINT/SIGTERM reach every rank (rank 0 drains, then stops the others).
int launch_ranks(const ServeArgs& args) {
  const int tp = args.tensor_parallel_size;
  const std::string model_dir = inference::resolve_model_dir(args.path);
  // The ranks' kind of device, found without touching the GPUs (no CUDA
  // context in this process, which holds none of the model).
  const int gpus = visible_gpus();
  c10::Device device = c10::kCPU;
  if (args.device == "auto") {
    if (gpus > 0) device = c10::Device(c10::kCUDA, 0);
  } else if (args.device.rfind("cuda", 0) == 0) {
    device = c10::Device(c10::kCUDA, 0);  // whether there are enough GPUs: check_tensor_parallel_size
  } else if (args.device != "cpu") {
    parse_device(args.device);  // names what is wrong with it
  }
  check_tensor_parallel_size(tp, models::read_config((std::filesystem::path(model_dir) / "config.json").string()),
                             args.device, device, gpus);
  serve_config(args, device, model_dir);
  if (args.port != 0 && launcher::port_in_use(args.port)) {
    // Rank 0 would find out only after every rank loaded the model.
    throw ConfigError(fmt::format("cannot listen on port {}: it is in use on this machine; pick another --port "
                                  "(0 = any free port)",
                                  args.port));
  }
  const std::string backend = device.is_cuda() ? "nccl" : "mpi";
  std::fprintf(stderr, "colossus serve: tensor_parallel_size %d: starting %d ranks (%s, %s); rank 0 serves HTTP\n", tp,
               tp, backend.c_str(), device.is_cuda() ? "one GPU each" : "cpu");
  // --exit_timeout 30: the other ranks follow rank 0's stop within a step.
  return launcher::run_job(
      {.nproc_per_node = tp, .backend = backend, .exit_timeout_s = 30, .command = own_command_line()});
}

int serve(const ServeArgs& args, const sigset_t& stop_signals, const c10::Device& device,
          const cluster::ProcessGroupPtr& tp_group);

int run_serve(const ServeArgs& args) {
  const int tp = args.tensor_parallel_size;
  if (tp < 1) check_tensor_parallel_size(tp, models::ModelConfig{}, args.device, c10::kCPU, 0);
  // Where this process sits: alone, or one rank of a job that a launcher
  // (`colossus run`, mpirun, the launch_ranks above) started.
  const cluster::LaunchInfo job = cluster::read_launch_info(process_env());
  if (job.world_size == 1 && tp > 1) return launch_ranks(args);
  if (job.world_size != tp) {
    throw ConfigError(fmt::format(
        "this process is rank {} of a {}-rank job, but --tensor_parallel_size is {}; serve one model over the job's "
        "ranks with --tensor_parallel_size {}, or {}",
        job.rank, job.world_size, tp, job.world_size,
        tp == 1 ? std::string("run `colossus serve` outside a job")
                : fmt::format("start `colossus serve --tensor_parallel_size {}` outside a job (it starts its {} ranks "
                              "itself)",
                              tp, tp)));
  }

  // SIGINT/SIGTERM go to one waiting thread, blocked from here on so that
  // every thread started later (loading starts torch's and CUDA's, the
  // process group its own, the server its pool) inherits the mask and a
  // signal during a long load is not fatal; a client gone away must not kill
  // us by SIGPIPE. Under tensor parallelism only rank 0 ever takes them: it
  // drains its requests, then tells the other ranks to stop.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (tp == 1) return serve(args, stop_signals, resolve_device(args.device), nullptr);

  // One rank of a tensor-parallel job. An error ends this process at once,
  // without the exit-time teardown of the process group: that teardown
  // (MPI_Finalize, NCCL's) waits for ranks that may be blocked in a
  // collective with this one, and the job would hang instead of the launcher
  // seeing this rank fail and stopping the others.
  try {
    const std::string model_dir = inference::resolve_model_dir(args.path);
    check_tensor_parallel_size(tp, models::read_config((std::filesystem::path(model_dir) / "config.json").string()),
                               args.device, c10::kCPU, 0);
    // NCCL ranks take cuda:LOCAL_RANK, MPI ranks the CPU.
    const std::string backend = args.device == "cpu" ? "mpi" : args.device == "cuda" ? "nccl" : "auto";
    const cluster::Cluster& cluster = cluster::launch_from_env({.backend = backend});
    return serve(args, stop_signals, cluster.device, cluster.world);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "colossus: error: %s\n", c10_error ? c10_error->what_without_backtrace() : e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

// Loads the model and serves it (alone, tp_group null), or is one rank of
// its tensor-parallel group: rank 0 serves, the others follow its steps.
int serve(const ServeArgs& args, const sigset_t& stop_signals, const c10::Device& device,
          const cluster::ProcessGroupPtr& tp_group) {
  const int tp = args.tensor_parallel_size;
  const int rank = tp_group ? tp_group->rank() : 0;
  const std::string model_dir = inference::resolve_model_dir(args.path);
  const ServeSettings settings = serve_config(args, device, model_dir);
  inference::InferenceConfig config = settings.config;
  std::shared_ptr<const data::Tokenizer> tokenizer = open_tokenizer(args.tokenizer, model_dir);
  auto chat = inference::serving::ChatPrompt::from_model_dir(model_dir);

  const auto load_start = std::chrono::steady_clock::now();
  std::shared_ptr<models::CausalLM> model =
      load_inference_model(model_dir, args.lora, {.dtype = config.model_dtype(), .device = device}, rank == 0);
  std::unique_ptr<inference::InferenceEngine> engine;
  try {
    engine = std::make_unique<inference::InferenceEngine>(model, tokenizer, config, tp_group);
  } catch (const ConfigError& e) {
    // auto: a model the graph kernels do not cover (head size, dtype) is served eagerly.
    if (args.use_cuda_graph != "auto" || !config.use_cuda_graph) throw;
    std::fprintf(stderr, "CUDA graphs off: %s\n", e.what());
    config.use_cuda_graph = false;
    engine = std::make_unique<inference::InferenceEngine>(model, tokenizer, config, tp_group);
  }
  if (rank != 0) {
    // This rank's engine does what rank 0's does, step by step, until rank 0 stops.
    std::fprintf(stderr, "rank %d of %d: loaded; following rank 0's steps\n", rank, tp);
    inference::serving::StepBroadcast steps(tp_group);
    inference::serving::follow_steps(*engine, steps);
    std::fprintf(stderr, "rank %d of %d: stopped\n", rank, tp);
    return 0;
  }
  const auto stats = engine->stats();
  std::string name = args.served_model_name;
  if (name.empty()) name = std::filesystem::path(args.path).lexically_normal().filename().string();
  if (name.empty() || name == ".") name = std::filesystem::path(model_dir).filename().string();
  std::string pool_sizing;  // what sized the KV pool, when memory did
  if (config.num_blocks == 0 && device.is_cuda()) {
    pool_sizing = config.gpu_memory_utilization
                      ? fmt::format(" (gpu_memory_utilization {})", *config.gpu_memory_utilization)
                      : fmt::format(" (kv_cache_memory_fraction {} of free memory)", config.kv_cache_memory_fraction);
  }
  const std::string tp_text = tp > 1 ? fmt::format(", tensor_parallel_size {} over {}", tp, tp_group->backend_name()) : "";
  std::fprintf(stderr, "loaded %s (%s, %s, %s%s%s) in %.1f s; KV cache %lld blocks of %lld tokens%s%s; chat: %s\n",
               model_dir.c_str(), models::model_type(model->config()).c_str(), config.dtype.c_str(),
               device.str().c_str(), config.use_cuda_graph ? ", CUDA graphs" : "", tp_text.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count(),
               static_cast<long long>(stats.blocks_total), static_cast<long long>(stats.block_size),
               tp > 1 ? " on each rank" : "", pool_sizing.c_str(),
               chat.has_template() ? "the model's template" : "no template (plain role: content lines)");

  // Asked to stop while loading: nothing was served, nothing to drain.
  const timespec no_wait{0, 0};
  if (const int sig = sigtimedwait(&stop_signals, nullptr, &no_wait); sig == SIGINT || sig == SIGTERM) {
    std::fprintf(stderr, "%s during loading: stopped\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    if (tp_group) inference::serving::StepBroadcast(tp_group).send({.stop = true});
    return 0;
  }

  inference::serving::Server server(std::move(engine), std::move(chat),
                                    {.host = args.host,
                                     .port = args.port,
                                     .served_model_name = name,
                                     .max_context = settings.max_model_len,
                                     .threads = args.threads,
                                     .max_connections = args.max_connections,
                                     .request_timeout_s = args.request_timeout,
                                     .log_requests = !args.quiet,
                                     .api_key = args.api_key,
                                     .allowed_origins = args.allowed_origins},
                                    tp_group);
  const int port = server.bind();
  std::fprintf(stderr,
               "serving '%s' on http://%s:%d (%smax_model_len %lld, max_batch_size %lld, max_input_len %lld, "
               "max_output_len %lld, max_num_batched_tokens %lld)\n",
               name.c_str(), args.host.c_str(), port,
               tp > 1 ? fmt::format("tensor_parallel_size {}, ", tp).c_str() : "",
               static_cast<long long>(settings.max_model_len), static_cast<long long>(config.max_batch_size),
               static_cast<long long>(config.max_input_len), static_cast<long long>(config.max_output_len),
               static_cast<long long>(config.token_budget()));

  std::atomic<bool> listening_done{false};
  std::thread signals([&] {
    const timespec tick{0, 200'000'000};
    while (!listening_done) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "%s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        // listen() may not have started yet: repeat until it has returned.
        while (!listening_done) {
          server.stop();
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    }
  });
  server.listen();
  listening_done = true;
  signals.join();
  if (auto failure = server.failure()) {
    throw DistError(fmt::format("stopped serving: {} (the tensor-parallel ranks no longer agree)", *failure));
  }
  std::fprintf(stderr, "stopped\n");
  return 0;
}
#endif

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto args = std::make_shared<ServeArgs>();
  auto& c = args->config;
  sub->add_option("PATH", args->path, "Model directory, checkpoint step directory, or run/checkpoints directory")
      ->required();
  sub->add_option("--host", args->host, "Address to listen on (0.0.0.0 = all interfaces)")->capture_default_str();
  sub->add_option("--port", args->port, "Port to listen on; 0 = any free port (printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  sub->add_option("--served_model_name,--served-model-name", args->served_model_name,
                  "The model name clients send (default: PATH's last component)");
  sub->add_option("--lora", args->lora,
                  "A PEFT LoRA adapter directory to merge into the model (a LoRA training checkpoint's own adapter/ "
                  "is found by itself)");
  sub->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer directory or file (default: the model directory); 'byte' = the built-in byte tokenizer");
  sub->add_option("--device", args->device, "auto (a GPU when there is one, else the CPU), cpu, cuda or cuda:N")
      ->capture_default_str();
  sub->add_option("--tensor_parallel_size,--tensor-parallel-size", args->tensor_parallel_size,
                  "Split the model over this many ranks (also -tp N), one GPU each (CPU ranks under MPI with --device "
                  "cpu or no GPU); this command starts them, rank 0 serves HTTP. Must divide the attention heads")
      ->capture_default_str();
  sub->add_option("--threads", args->threads,
                  "HTTP worker threads, one per open connection (at most 4096); 0 = max(16, 2 x max_batch_size)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--max_connections", args->max_connections,
                  "Open connections (served or waiting for a thread) beyond which new ones get 503 at once; "
                  "0 = 4 x threads")
      ->check(CLI::Range(0, 1'000'000))
      ->capture_default_str();
  sub->add_option("--request_timeout", args->request_timeout,
                  "Seconds a connection has to send a whole request (from opening, or from its last response) "
                  "before it is cut with 408; a running request or stream has no limit")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  sub->add_flag("--quiet", args->quiet, "No log line per request");
  sub->add_option("--api_key,--api-key", args->api_key,
                  "Clients of the /v1 routes must send 'Authorization: Bearer KEY' (as vLLM's: /health, /metrics, "
                  "/tokenize and /detokenize stay open); prefer the env COLOSSUS_API_KEY, which `ps` does not show")
      ->envname("COLOSSUS_API_KEY");
  sub->add_option("--allowed_origins,--allowed-origins", args->allowed_origins,
                  "Web origins (e.g. http://localhost:3000) whose browser requests are served, with CORS headers "
                  "and preflights answered; '*' = any. Requests with another Origin header get 403")
      ->delimiter(',');
  // InferenceConfig's fields, under their own names.
  sub->add_option("--max_model_len,--max-model-len", args->max_model_len,
                  "Tokens a request may span, prompt and output together (vLLM's); unset = the model's context");
  args->max_batch_size_option =
      sub->add_option("--max_batch_size,--max-batch-size,--max_num_seqs,--max-num-seqs", c.max_batch_size,
                      fmt::format("Sequences decoded together in one step (vLLM's max_num_seqs); unset = {} on a GPU, "
                                  "{} on the CPU",
                                  kGpuMaxNumSeqs, c.max_batch_size));
  args->max_input_len_option = sub->add_option("--max_input_len,--max-input-len", c.max_input_len,
                                               "Most prompt tokens a request may bring; unset = max_model_len - 1");
  args->max_output_len_option =
      sub->add_option("--max_output_len,--max-output-len", c.max_output_len,
                      "Most tokens a request may generate (max_tokens); unset = max_model_len - 1 (a request's "
                      "default max_tokens is what fits after its prompt)");
  args->max_num_batched_tokens_option =
      sub->add_option("--max_num_batched_tokens,--max-num-batched-tokens", c.max_num_batched_tokens,
                      fmt::format("Tokens one step may process (longer prompts are prefilled in chunks); unset = "
                                  "min({}, max_input_len), at least max_batch_size",
                                  kMaxNumBatchedTokens));
  sub->add_option("--prefill_ratio,--prefill-ratio", c.prefill_ratio,
                  "Share of the step's token budget prefill may take while others decode")
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype,
                  "Weights and compute dtype; auto = the model's own on a GPU (fp32 checkpoints in bf16), fp32 on "
                  "the CPU")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--kv_cache_dtype,--kv-cache-dtype", c.kv_cache_dtype, "KV cache dtype; auto = the model's")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--block_size,--block-size", c.block_size, "Tokens per KV cache block (1..1024)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--num_blocks,--num-blocks", c.num_blocks,
                  "KV cache blocks; 0 = from GPU memory (--gpu_memory_utilization), or on the CPU max_batch_size "
                  "full-length sequences within 4 GiB (at least one)")
      ->capture_default_str();
  args->gpu_memory_utilization_option =
      sub->add_option("--gpu_memory_utilization,--gpu-memory-utilization", args->gpu_memory_utilization,
                      "Share (0, 1] of the GPU's total memory this server may use for weights, activations and the "
                      "KV cache (vLLM's meaning); the KV cache gets what is left after the model and one step's "
                      "activation headroom. With num_blocks 0; ignored on the CPU")
          ->capture_default_str();
  args->kv_cache_memory_fraction_option =
      sub->add_option("--kv_cache_memory_fraction,--kv-cache-memory-fraction", c.kv_cache_memory_fraction,
                      "Instead of --gpu_memory_utilization: the KV cache takes this share of the GPU memory free "
                      "after the model (with num_blocks 0; ignored on the CPU)")
          ->capture_default_str();
  sub->add_option("--enable_prefix_caching,--enable-prefix-caching", c.enable_prefix_caching,
                  "Reuse KV blocks of shared prompt prefixes (true/false)")
      ->capture_default_str();
  sub->add_option("--use_cuda_graph,--use-cuda-graph", args->use_cuda_graph,
                  "Replay decode steps from CUDA graphs: auto (on a GPU), true or false")
      ->check(CLI::IsMember({"auto", "true", "false"}))
      ->capture_default_str();
  args->max_context_len_to_capture_option =
      sub->add_option("--max_context_len_to_capture,--max-context-len-to-capture", c.max_context_len_to_capture,
                      fmt::format("With use_cuda_graph: longest context a replayed decode step may have (longer ones "
                                  "run eagerly); unset = min({}, max_model_len)",
                                  kMaxContextLenToCapture));
  sub->add_flag("--do_sample,--do-sample", c.do_sample, "Sample by default (requests may still set temperature 0)");
  sub->add_option("--temperature", c.temperature, "Default temperature")->capture_default_str();
  sub->add_option("--top_k,--top-k", c.top_k, "Default top-k; 0 = off")->capture_default_str();
  sub->add_option("--top_p,--top-p", c.top_p, "Default top-p; 1 = off")->capture_default_str();
  sub->add_option("--repetition_penalty,--repetition-penalty", c.repetition_penalty, "Default repetition penalty")
      ->capture_default_str();
  sub->add_option("--seed", c.seed, "Default seed of greedy requests' generators (sampled ones without a seed get a random one)")
      ->capture_default_str();
  sub->footer(kFooter);
#ifdef COLOSSUS_WITH_SERVER
  return {sub, [args] { return run_serve(*args); }};
#else
  return {sub, [] () -> int {
            throw ConfigError("this colossus was built without cpp-httplib (libcpp-httplib-dev), so it cannot serve; "
                              "install it and rebuild");
          }};
#endif
}

}  // namespace colossus::cli
