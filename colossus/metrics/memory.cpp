#include "colossus/metrics/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace colossus::metrics {

int64_t host_rss_bytes() {
  // statm's second field is resident pages; one short read, cheap enough for 10 Hz redraws.
  FILE* file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return 0;
  long long size_pages = 0;
  long long resident_pages = 0;
  int fields = std::fscanf(file, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(file);
  if (fields != 2) return 0;
  return static_cast<int64_t>(resident_pages) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

int64_t host_peak_rss_bytes() {
  if (FILE* file = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof(line), file) != nullptr) {
      if (std::strncmp(line, "VmHWM:", 6) == 0) {
        std::sscanf(line + 6, "%lld", &kib);
        break;
      }
    }
    std::fclose(file);
    if (kib >= 0) return static_cast<int64_t>(kib) * 1024;
  }
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {

struct ProbeSlot {
  std::mutex mutex;
  DeviceMemoryProbe probe;
  DeviceMemoryPeakReset reset;
  int64_t carried_peak = 0;  // the largest peak a reset cleared
};

ProbeSlot& slot() {
  static ProbeSlot instance;
  return instance;
}

}  // namespace

void set_device_memory_probe(DeviceMemoryProbe probe) {
  std::lock_guard<std::mutex> lock(slot().mutex);
  slot().probe = std::move(probe);
}

std::optional<DeviceMemory> device_memory() {
  DeviceMemoryProbe probe;
  {
    std::lock_guard<std::mutex> lock(slot().mutex);
    probe = slot().probe;
  }
  // Called outside the lock: a probe may itself take locks (the CUDA allocator's).
  if (!probe) return std::nullopt;
  auto memory = probe();
  if (memory) {
    std::lock_guard<std::mutex> lock(slot().mutex);
    memory->max_allocated_bytes =
        std::max({memory->max_allocated_bytes, memory->peak_allocated_bytes, slot().carried_peak});
  }
  return memory;
}

void set_device_memory_peak_reset(DeviceMemoryPeakReset reset) {
  std::lock_guard<std::mutex> lock(slot().mutex);
  slot().reset = std::move(reset);
}

void reset_device_memory_peak() {
  DeviceMemoryPeakReset reset;
  {
    std::lock_guard<std::mutex> lock(slot().mutex);
    reset = slot().reset;
  }
  if (!reset) return;
  if (const auto memory = device_memory()) {
    std::lock_guard<std::mutex> lock(slot().mutex);
    slot().carried_peak = std::max(slot().carried_peak, memory->max_allocated_bytes);
  }
  reset();  // outside the lock, as the probe
}

bool device_memory_peak_resettable() {
  std::lock_guard<std::mutex> lock(slot().mutex);
  return static_cast<bool>(slot().reset);
}

}  // namespace colossus::metrics
