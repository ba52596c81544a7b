// DataLoader: this rank's batches of a TokenDataset, prepared by a background
// thread a few batches ahead so the training step never waits on reading.
// Its (epoch, position) state is saved in checkpoints so a resumed run reads
// exactly the batches an uninterrupted run would have.
#pragma once
#include "colossus/data/token_dataset.h"

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace colossus::data {

struct DataLoaderOptions {
  int64_t batch_size = 8;  // per rank (one micro-batch)
  int prefetch = 4;        // batches prepared ahead
  bool pin_memory = false; // page-locked host memory for fast copies to the GPU
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenDataset> dataset, DistributedSampler sampler, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next (batch_size, seq_len) int64 batch; rolls into the next epoch
  // (reshuffled) when this one ends. Incomplete final batches are dropped.
  at::Tensor next();
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // batches already returned in this epoch
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Continue from a saved state; restarts the prefetch thread.
  void set_state(int64_t epoch, int64_t position);
  const TokenDataset& dataset() const { return *dataset_; }

 private:
  void start();
  void stop();
  void produce(int64_t epoch, int64_t position);

  std::shared_ptr<const TokenDataset> dataset_;
  DistributedSampler sampler_;
  DataLoaderOptions options_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t position_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<at::Tensor> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace colossus::data
