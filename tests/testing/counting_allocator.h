// A CPU allocator for memory tests: passes allocations to the default one and
// tracks live and peak bytes (installed once, process-wide, on first use).
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace colossus::testing {

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) override {
    auto* record = new Record{base_->allocate(bytes), bytes, this};
    live_ += static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (live_.load() > peak && !peak_.compare_exchange_weak(peak, live_.load())) {
    }
    void* data = record->inner.get();
    return {data, record, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  void reset_peak() { peak_ = live_.load(); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  struct Record {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
  };
  static void release(void* ctx) {
    auto* record = static_cast<Record*>(ctx);
    record->owner->live_ -= static_cast<int64_t>(record->bytes);
    delete record;
  }
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

// The process-wide instance (leaked on purpose: tensors may outlive main).
inline CountingAllocator& counting_allocator() {
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *allocator;
}

}  // namespace colossus::testing
