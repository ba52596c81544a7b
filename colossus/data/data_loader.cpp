#include "colossus/data/data_loader.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colossus::data {

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> dataset, DistributedSampler sampler,
                       DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  if (options_.batch_size < 1) throw ConfigError(fmt::format("batch_size = {} must be at least 1", options_.batch_size));
  if (options_.prefetch < 1) throw ConfigError(fmt::format("prefetch = {} must be at least 1", options_.prefetch));
  batches_per_epoch_ = sampler_.samples_per_rank() / options_.batch_size;
  if (batches_per_epoch_ == 0) {
    throw ConfigError(fmt::format("each rank gets {} samples per epoch, fewer than one batch of {}; use a smaller "
                                  "batch or more data", sampler_.samples_per_rank(), options_.batch_size));
  }
  start();
}

DataLoader::~DataLoader() { stop(); }

void DataLoader::start() {
  stopping_ = false;
  ready_.clear();
  error_ = nullptr;
  worker_ = std::thread([this, epoch = epoch_, position = position_] { produce(epoch, position); });
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void DataLoader::produce(int64_t epoch, int64_t position) {
  try {
    while (true) {
      auto order = sampler_.indices(epoch);
      for (; position < batches_per_epoch_; ++position) {
        std::vector<int64_t> picks(order.begin() + position * options_.batch_size,
                                   order.begin() + (position + 1) * options_.batch_size);
        auto batch = dataset_->batch(picks);
        if (options_.pin_memory) batch = batch.pin_memory();
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || static_cast<int>(ready_.size()) < options_.prefetch; });
        if (stopping_) return;
        ready_.push_back(std::move(batch));
        cv_.notify_all();
      }
      ++epoch;
      position = 0;
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

at::Tensor DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  auto batch = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  if (++position_ == batches_per_epoch_) {
    ++epoch_;
    position_ = 0;
  }
  return batch;
}

void DataLoader::set_state(int64_t epoch, int64_t position) {
  if (epoch < 0 || position < 0 || position >= batches_per_epoch_) {
    throw ConfigError(fmt::format("data loader state (epoch {}, batch {}) is outside 0..{} batches per epoch; was the "
                                  "checkpoint made with another batch size or dataset?",
                                  epoch, position, batches_per_epoch_ - 1));
  }
  stop();
  epoch_ = epoch;
  position_ = position;
  start();
}

}  // namespace colossus::data
