// The engine's own thread: admit submissions, apply aborts, step, dispatch.
#include "colossus/inference/serving/engine_loop.h"

#include "colossus/core/errors.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace colossus::inference::serving {

std::vector<ChoiceOutput> Channel::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !queue_.empty() || closed_; });
  std::vector<ChoiceOutput> out(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

std::optional<std::string> Channel::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

bool Channel::closed() const {
  std::lock_guard lock(mutex_);
  return closed_ && queue_.empty();
}

bool Channel::wait_admitted() {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return admitted_ || closed_; });
  return admitted_;
}

void Channel::admit() {
  {
    std::lock_guard lock(mutex_);
    admitted_ = true;
  }
  ready_.notify_all();
}

void Channel::push(ChoiceOutput output, bool last) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(output));
    if (last) closed_ = true;
  }
  ready_.notify_all();
}

void Channel::fail(std::string message) {
  {
    std::lock_guard lock(mutex_);
    if (!closed_ && !error_) error_ = std::move(message);
    closed_ = true;
  }
  ready_.notify_all();
}

EngineLoop::EngineLoop(std::unique_ptr<InferenceEngine> engine, std::unique_ptr<StepBroadcast> tp_steps,
                       std::function<void()> on_failure)
    : engine_(std::move(engine)),
      tokenizer_(engine_->tokenizer()),
      config_(engine_->config()),
      tp_steps_(std::move(tp_steps)),
      on_failure_(std::move(on_failure)) {
  TORCH_CHECK(!tp_steps_ || tp_steps_->group()->rank() == 0, "EngineLoop: only tp rank 0 runs the loop");
  stats_.engine = engine_->stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

std::shared_ptr<Channel> EngineLoop::submit(std::vector<std::vector<int64_t>> prompts, RequestOptions options) {
  std::vector<RequestOptions> each(prompts.size(), options);
  return submit(std::move(prompts), std::move(each));
}

std::shared_ptr<Channel> EngineLoop::submit(std::vector<std::vector<int64_t>> prompts,
                                            std::vector<RequestOptions> options) {
  TORCH_CHECK(options.size() == prompts.size(), "EngineLoop::submit: ", options.size(), " options for ",
              prompts.size(), " prompts");
  auto channel = std::make_shared<Channel>();
  {
    std::lock_guard lock(mutex_);
    if (stop_ || failure_) {
      channel->fail(failure_.value_or(kShuttingDown));
      return channel;
    }
    incoming_.push_back({channel, std::move(prompts), std::move(options)});
  }
  wake_.notify_one();
  return channel;
}

void EngineLoop::abort(const std::shared_ptr<Channel>& channel) {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    aborts_.push_back(channel);
  }
  wake_.notify_one();
}

void EngineLoop::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

LoopStats EngineLoop::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::optional<std::string> EngineLoop::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void EngineLoop::admit(Submission& submission, StepCommands& commands) {
  if (tp_steps_) commands.submissions.push_back({.prompts = submission.prompts, .options = submission.options});
  Admission admission = admit_submission(*engine_, std::move(submission.prompts), submission.options);
  if (tp_steps_) commands.submissions.back().ids = admission.ids;
  if (!admission.refusal.empty()) {
    submission.channel->fail(std::move(admission.refusal));
    std::lock_guard lock(mutex_);
    ++stats_.rejected;
    return;
  }
  const std::vector<int64_t>& ids = admission.ids;
  auto remaining = std::make_shared<int64_t>(static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    live_[ids[i]] = {.channel = submission.channel,
                     .index = static_cast<int64_t>(i),
                     .remaining = remaining,
                     .submitted = submission.submitted};
  }
  submission.channel->admit();
}

void EngineLoop::abort_live(const std::shared_ptr<Channel>* channel, StepCommands& commands) {
  for (const auto& [id, live] : live_) {
    if (channel != nullptr && live.channel != *channel) continue;
    engine_->abort_request(id);
    commands.aborts.push_back(id);
  }
}

void EngineLoop::fail_all(const std::string& message) {
  for (const auto& [id, live] : live_) live.channel->fail(message);
  live_.clear();
}

void LatencyHistogram::observe(double seconds) {
  const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin();
  ++counts[static_cast<size_t>(bucket)];
  sum += seconds;
  ++count;
}

void EngineLoop::dispatch(std::vector<RequestOutput> outputs) {
  int64_t stop = 0, length = 0, aborted = 0, prompt_tokens = 0;
  const auto now = std::chrono::steady_clock::now();
  std::vector<double> first_token, per_token, e2e;  // seconds, observed under the lock below
  struct Delivery {
    std::shared_ptr<Channel> channel;
    ChoiceOutput output;
    bool last = false;
    std::optional<std::string> error{};  // this request failed alone: fail its channel instead
  };
  std::vector<Delivery> deliveries;
  for (RequestOutput& out : outputs) {
    auto it = live_.find(out.request_id);
    if (it == live_.end()) continue;  // a prompt of a refused submission
    Live& live = it->second;
    if (!out.new_tokens.empty()) {
      if (!live.last_token) {
        first_token.push_back(std::chrono::duration<double>(now - live.submitted).count());
        prompt_tokens += out.prompt_tokens;
      } else {
        // Each token of this output shares the interval since the last ones.
        const double interval = std::chrono::duration<double>(now - *live.last_token).count() /
                                static_cast<double>(out.new_tokens.size());
        per_token.insert(per_token.end(), out.new_tokens.size(), interval);
      }
      live.last_token = now;
    }
    if (out.finished) e2e.push_back(std::chrono::duration<double>(now - live.submitted).count());
    if (out.error) {
      // This request failed alone: its client gets the error, the batch goes on.
      ++aborted;
      deliveries.push_back({.channel = live.channel, .error = "the engine failed on this request: " + *out.error});
      live_.erase(it);
      continue;
    }
    const bool finished = out.finished;
    bool last = false;
    if (finished) {
      switch (out.finish_reason) {
        case FinishReason::Stop: ++stop; break;
        case FinishReason::Length: ++length; break;
        default: ++aborted; break;
      }
      last = --*live.remaining == 0;
    }
    deliveries.push_back({.channel = live.channel, .output = {.index = live.index, .output = std::move(out)}, .last = last});
    if (finished) live_.erase(it);
  }
  {
    // Counted before any client hears of its tokens, so /metrics read after
    // a response already includes that response.
    std::lock_guard lock(mutex_);
    for (double v : first_token) stats_.time_to_first_token.observe(v);
    for (double v : per_token) stats_.time_per_output_token.observe(v);
    for (double v : e2e) stats_.e2e_request_latency.observe(v);
    stats_.finished_stop += stop;
    stats_.finished_length += length;
    stats_.finished_abort += aborted;
    stats_.prompt_tokens += prompt_tokens;
  }
  for (Delivery& d : deliveries) {
    if (d.error) {
      d.channel->fail(*d.error);
    } else {
      d.channel->push(std::move(d.output), d.last);
    }
  }
}

void EngineLoop::refresh_stats() {
  const EngineStats engine = engine_->stats();
  const auto now = std::chrono::steady_clock::now();
  rate_window_.push_back({now, {engine.prompt_tokens, engine.generated_tokens}});
  // Rates over the last ~5 s of steps (0 when idle for longer).
  while (rate_window_.size() > 1 && now - rate_window_.front().first > std::chrono::seconds(5)) rate_window_.pop_front();
  double prompt_rate = 0, generation_rate = 0;
  if (rate_window_.size() > 1) {
    const double seconds = std::chrono::duration<double>(now - rate_window_.front().first).count();
    if (seconds > 0) {
      prompt_rate = static_cast<double>(engine.prompt_tokens - rate_window_.front().second.first) / seconds;
      generation_rate = static_cast<double>(engine.generated_tokens - rate_window_.front().second.second) / seconds;
    }
  }
  std::lock_guard lock(mutex_);
  stats_.engine = engine;
  stats_.prompt_tokens_per_second = prompt_rate;
  stats_.generation_tokens_per_second = generation_rate;
}

bool EngineLoop::step() {
  try {
    dispatch(engine_->step());
    return true;
  } catch (const std::exception& e) {
    std::string message = std::string("the engine failed: ") + e.what();
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
      message = std::string("the engine failed: ") + c10_error->what_without_backtrace();
    }
    if (tp_steps_) {
      // The other ranks stepped, or wait inside this step's collectives:
      // their engines no longer agree with this one, so none may step again.
      end_on_failure(message);
      return false;
    }
    // A failed step (out of memory, a kernel error) ends everything in flight, not the server.
    for (const auto& [id, live] : live_) engine_->abort_request(id);
    fail_all(message);
    try {
      engine_->step();  // collects the aborts
    } catch (const std::exception&) {
    }
    return true;
  }
}

void EngineLoop::end_on_failure(const std::string& message) {
  fail_all(message);
  std::deque<Submission> queued;
  {
    std::lock_guard lock(mutex_);
    failure_ = message;
    queued.swap(incoming_);
  }
  for (Submission& submission : queued) submission.channel->fail(message);
  if (on_failure_) on_failure_();
}

void EngineLoop::run() {
  for (;;) {
    std::deque<Submission> incoming;
    std::vector<std::shared_ptr<Channel>> aborts;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      // Idle: sleep until there is work; the 1 s tick lets the token rates
      // decay to 0 (and, under tensor parallelism, is the other ranks' heartbeat).
      wake_.wait_for(lock, std::chrono::seconds(1),
                     [&] { return stop_ || !incoming_.empty() || !aborts_.empty() || engine_->has_unfinished(); });
      incoming.swap(incoming_);
      aborts.swap(aborts_);
      stopping = stop_;
    }
    StepCommands commands;
    for (Submission& submission : incoming) {
      if (stopping) submission.channel->fail(kShuttingDown);
      else admit(submission, commands);
    }
    for (const auto& channel : aborts) abort_live(&channel, commands);
    if (stopping) abort_live(nullptr, commands);
    commands.step = engine_->has_unfinished() || !aborts.empty() || stopping;
    commands.stop = stopping;
    if (tp_steps_) {
      try {
        tp_steps_->send(commands);
      } catch (const std::exception& e) {
        end_on_failure(std::string("the tensor-parallel ranks could not be told the step: ") + e.what());
        return;
      }
    }
    if (commands.step && !step()) return;
    refresh_stats();
    if (stopping) {
      fail_all(kShuttingDown);
      return;
    }
  }
}

}  // namespace colossus::inference::serving
