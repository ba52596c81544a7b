// EngineLoop: the one thread that owns an InferenceEngine (which is not
// thread-safe). HTTP handler threads submit requests and aborts through a
// queue; the loop adds them, steps the engine while work is left, and hands
// each output to the submitting request's Channel, on which its handler waits.
// Under tensor parallelism it is rank 0's loop and tells the other ranks each
// step's changes before it steps (tensor_parallel_steps.h).
#pragma once
#include "colossus/inference/engine/engine.h"
#include "colossus/inference/serving/tensor_parallel_steps.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace colossus::inference::serving {

// The one failure message a client may see verbatim from a 5xx (others are logged).
inline constexpr const char* kShuttingDown = "the server is shutting down";

// One output of one choice (prompt) of a submission.
struct ChoiceOutput {
  int64_t index = 0;  // the prompt's position in the submission
  RequestOutput output;
};

// What a handler thread waits on: the outputs of its prompts as they arrive,
// or the error that refused the submission.
class Channel {
 public:
  // Blocks until outputs or an end are available (or `timeout` passes: then
  // returns an empty list with closed() false). Returns everything queued.
  std::vector<ChoiceOutput> wait(std::chrono::milliseconds timeout);
  // The engine refused the submission (ConfigError's message); set at most once, before any output.
  std::optional<std::string> error() const;
  bool closed() const;  // every choice finished, or the submission failed, or the loop stopped
  // Blocks until the engine has taken the submission (true) or refused it (false: see error()).
  bool wait_admitted();

 private:
  friend class EngineLoop;
  void push(ChoiceOutput output, bool last);
  void fail(std::string message);
  void admit();

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ChoiceOutput> queue_;
  std::optional<std::string> error_;
  bool closed_ = false;
  bool admitted_ = false;
};

// Counters the loop keeps beside the engine's own, for /metrics.
// A Prometheus histogram: counts per upper bound (cumulative when rendered).
struct LatencyHistogram {
  std::vector<double> bounds;   // seconds, ascending (+Inf implied)
  std::vector<int64_t> counts;  // per bucket, bounds.size() + 1
  double sum = 0;
  int64_t count = 0;
  explicit LatencyHistogram(std::vector<double> upper_bounds = {})
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void observe(double seconds);
};

struct LoopStats {
  EngineStats engine;
  // Per request (prompt): submission to its first token, between its
  // tokens, submission to its end. vLLM's bucket bounds.
  LatencyHistogram time_to_first_token{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                        5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}};
  LatencyHistogram time_per_output_token{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                          5.0, 7.5, 10.0, 20.0, 40.0, 80.0}};
  LatencyHistogram e2e_request_latency{{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}};
  int64_t finished_stop = 0;    // requests (prompts) ended by eos or a stop string
  int64_t finished_length = 0;  // ... by max_tokens
  int64_t finished_abort = 0;   // ... by a client that went away (or shutdown)
  int64_t rejected = 0;         // submissions the engine refused
  // Prompt tokens of requests that drew their first token, prefix-cache hits
  // included and recomputation after preemption not: vLLM's prompt_tokens_total.
  int64_t prompt_tokens = 0;
  double generation_tokens_per_second = 0;  // over the last few seconds
  double prompt_tokens_per_second = 0;
};

class EngineLoop {
 public:
  // With `tp_steps` (rank 0 of the engine's tp group) every iteration first
  // broadcasts its StepCommands (idle: once a second). A failed step then
  // ends the loop for good, since the ranks' engines no longer agree:
  // failure() says why, every request gets that error, and on_failure runs
  // once on the loop thread (the server stops listening from it).
  explicit EngineLoop(std::unique_ptr<InferenceEngine> engine, std::unique_ptr<StepBroadcast> tp_steps = nullptr,
                      std::function<void()> on_failure = {});
  ~EngineLoop();  // stop()s

  // Queues prompts (token ids) with shared options; the returned channel gets
  // their outputs, tagged with the prompt's index. Never blocks on the engine.
  std::shared_ptr<Channel> submit(std::vector<std::vector<int64_t>> prompts, RequestOptions options);
  // Each prompt with its own options (options.size() == prompts.size()).
  std::shared_ptr<Channel> submit(std::vector<std::vector<int64_t>> prompts, std::vector<RequestOptions> options);
  // The client of `channel` went away: its unfinished prompts are aborted (blocks freed).
  void abort(const std::shared_ptr<Channel>& channel);
  // Aborts what is still running, closes every channel and joins the thread. Idempotent.
  void stop();

  LoopStats stats() const;  // a snapshot taken after the last step
  // Set when the loop ended on a failed tensor-parallel step.
  std::optional<std::string> failure() const;
  // The engine's immutable parts, safe to read from any thread.
  const data::Tokenizer* tokenizer() const { return tokenizer_; }
  const InferenceConfig& config() const { return config_; }

 private:
  struct Submission {
    std::shared_ptr<Channel> channel;
    std::vector<std::vector<int64_t>> prompts;
    std::vector<RequestOptions> options;  // one per prompt
    std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();
  };
  struct Live {
    std::shared_ptr<Channel> channel;
    int64_t index = 0;
    std::shared_ptr<int64_t> remaining;  // unfinished prompts of its submission
    std::chrono::steady_clock::time_point submitted;
    std::optional<std::chrono::steady_clock::time_point> last_token;  // when its latest tokens came
  };
  void run();
  // One iteration's admissions and aborts, applied to the engine and written
  // into `commands` (for the other tp ranks).
  void admit(Submission& submission, StepCommands& commands);
  void abort_live(const std::shared_ptr<Channel>* channel, StepCommands& commands);  // null: every live request
  // Steps the engine; false when a tensor-parallel step failed (the loop must end).
  bool step();
  void fail_all(const std::string& message);        // every live request's channel
  void end_on_failure(const std::string& message);  // tensor parallel: failure_ set, everything failed
  void dispatch(std::vector<RequestOutput> outputs);
  void refresh_stats();

  std::unique_ptr<InferenceEngine> engine_;
  const data::Tokenizer* tokenizer_;
  InferenceConfig config_;
  std::unique_ptr<StepBroadcast> tp_steps_;
  std::function<void()> on_failure_;

  mutable std::mutex mutex_;  // guards the queues, stop_, failure_ and stats_
  std::condition_variable wake_;
  std::deque<Submission> incoming_;
  std::vector<std::shared_ptr<Channel>> aborts_;
  bool stop_ = false;
  std::optional<std::string> failure_;
  LoopStats stats_;

  // Loop-thread only.
  std::map<int64_t, Live> live_;  // engine request id -> its channel
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::pair<int64_t, int64_t>>> rate_window_;
  std::thread thread_;
};

}  // namespace colossus::inference::serving
