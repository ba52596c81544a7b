#include "colossus/data/sft_stream.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <functional>
#include <limits>
#include <random>
#include <mutex>
#include <thread>
#include <vector>

namespace colossus::data {

void SftStreamOptions::validate() const {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ConfigError(fmt::format("SFT stream rank {} of {} ranks: need 0 <= rank < world", rank, world));
  }
  if (threads < 1 || threads > 256) {
    throw ConfigError(fmt::format("SFT tokenizing threads is {} but must be in [1, 256]", threads));
  }
  if (lookahead < 1) throw ConfigError(fmt::format("SFT stream lookahead is {} but must be >= 1", lookahead));
}

nlohmann::json SftStreamPosition::to_json() const {
  return {{"source", source.to_json()}, {"record_index", record_index}, {"epoch", epoch}, {"dropped", dropped}};
}

SftStreamPosition SftStreamPosition::from_json(const nlohmann::json& j) {
  try {
    return {.source = JsonlPosition::from_json(j.at("source")),
            .record_index = j.at("record_index").get<int64_t>(),
            .epoch = j.at("epoch").get<int64_t>(),
            .dropped = j.at("dropped").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("an SFT data position is malformed ({}): {}", e.what(), j.dump()));
  }
}

// A fixed pool that runs tokenization tasks in submission order of pickup;
// results come back through each task's future, so order is the caller's.
class SftExampleStream::Workers {
 public:
  explicit Workers(int count) {
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Workers() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }
  std::future<SftExample> submit(std::function<SftExample()> fn) {
    std::packaged_task<SftExample()> task(std::move(fn));
    auto future = task.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    ready_.notify_one();
    return future;
  }

 private:
  void work() {
    for (;;) {
      std::packaged_task<SftExample()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // an exception lands in the future
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<SftExample()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    // j uniform in [0, i]: reject the draws past the largest multiple of i + 1.
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
    uint64_t draw = rng();
    while (draw >= limit) draw = rng();
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(draw % bound)]);
  }
  return order;
}

SftExampleStream::SftExampleStream(const std::string& source, const JsonlSourceOptions& source_options,
                                   SftExampleBuilder builder, const SftStreamOptions& options)
    : source_(source, source_options), builder_(std::move(builder)), options_(options) {
  options_.validate();
  start_ = source_.position();
  if (options_.shuffle_seed) {
    // One pass to index the records (bad lines fail or are skipped here, once).
    for (JsonlPosition before = source_.position(); source_.next(); before = source_.position())
      record_starts_.push_back(before);
    source_.seek(start_);
  }
  if (options_.threads > 1) workers_ = std::make_unique<Workers>(options_.threads);
}

const JsonlPosition& SftExampleStream::shuffled_start(int64_t epoch, int64_t record_index) {
  if (order_epoch_ != epoch) {
    order_ = shuffled_order(static_cast<int64_t>(record_starts_.size()), *options_.shuffle_seed, epoch);
    order_epoch_ = epoch;
  }
  return record_starts_[static_cast<size_t>(order_[static_cast<size_t>(record_index)])];
}

SftExampleStream::~SftExampleStream() { clear(); }

void SftExampleStream::clear() {
  for (auto& p : pending_) {
    if (p.example.valid()) p.example.wait();  // the tasks read records this deque owns
  }
  pending_.clear();
}

void SftExampleStream::fill() {
  while (static_cast<int64_t>(pending_.size()) < options_.lookahead && !exhausted_) {
    const bool shuffled = options_.shuffle_seed.has_value();
    const bool epoch_done = shuffled && record_index_ == static_cast<int64_t>(record_starts_.size());
    // Shuffled: read only this rank's records, each where the epoch's order puts it.
    if (shuffled && !epoch_done && record_index_ % options_.world != options_.rank) {
      ++record_index_;
      continue;
    }
    if (shuffled && !epoch_done) source_.seek(shuffled_start(epoch_, record_index_));
    const JsonlPosition before = source_.position();
    std::optional<JsonlRecord> record = epoch_done ? std::nullopt : source_.next();
    if (!record) {
      if (!options_.loop || record_index_ == 0) {
        exhausted_ = true;
        break;
      }
      if (mine_this_epoch_ == 0) {
        throw ConfigError(fmt::format("data.source has {} records, fewer than the {} data-parallel ranks: rank {} gets "
                                      "none; give more records or use fewer ranks",
                                      record_index_, options_.world, options_.rank));
      }
      mine_this_epoch_ = 0;
      ++epoch_;
      record_index_ = 0;
      source_.seek(start_);
      continue;
    }
    const int64_t index = record_index_++;
    if (index % options_.world != options_.rank) continue;
    ++mine_this_epoch_;
    Pending p{.before = before, .record_index = index, .epoch = epoch_};
    auto build = [this, r = std::move(record->record)] { return builder_.build(r); };
    if (workers_) {
      p.example = workers_->submit(std::move(build));
    } else {
      std::promise<SftExample> done;
      try {
        done.set_value(build());
      } catch (...) {
        done.set_exception(std::current_exception());
      }
      p.example = done.get_future();
    }
    pending_.push_back(std::move(p));
  }
}

std::optional<SftExample> SftExampleStream::next() {
  for (;;) {
    fill();
    if (pending_.empty()) return std::nullopt;
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    SftExample example = p.example.get();
    if (p.epoch != last_epoch_) {
      // A whole pass that gave this rank nothing trainable would loop forever.
      if (last_epoch_ >= 0 && taken_this_epoch_ == 0) {
        throw ConfigError(fmt::format("no record of data.source gives data-parallel rank {} of {} a trained token (all "
                                      "{} dropped: prompts longer than data.max_length?)",
                                      options_.rank, options_.world, dropped_));
      }
      last_epoch_ = p.epoch;
      taken_this_epoch_ = 0;
    }
    if (example.trains_nothing()) {
      ++dropped_;
      continue;
    }
    ++taken_this_epoch_;
    return example;
  }
}

SftStreamPosition SftExampleStream::position() const {
  if (!pending_.empty()) {
    const Pending& front = pending_.front();
    return {.source = front.before, .record_index = front.record_index, .epoch = front.epoch, .dropped = dropped_};
  }
  return {.source = source_.position(), .record_index = record_index_, .epoch = epoch_, .dropped = dropped_};
}

void SftExampleStream::seek(const SftStreamPosition& position) {
  if (position.record_index < 0 || position.epoch < 0 || position.dropped < 0) {
    throw ConfigError(fmt::format("an SFT data position has a negative field: {}", position.to_json().dump()));
  }
  clear();
  source_.seek(position.source);
  record_index_ = position.record_index;
  epoch_ = position.epoch;
  dropped_ = position.dropped;
  exhausted_ = false;
  last_epoch_ = position.epoch;
  taken_this_epoch_ = 1;  // a resumed pass is not known to be empty
  mine_this_epoch_ = 1;
}

}  // namespace colossus::data
