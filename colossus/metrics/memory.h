// Memory figures for progress lines: host RSS from /proc, and a slot for device
// memory that a CUDA build fills (this library stays free of CUDA headers).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>

namespace colossus::metrics {

// Resident set size of this process in bytes (/proc/self/statm); 0 where unavailable.
int64_t host_rss_bytes();
// Peak resident set size in bytes (VmHWM, else getrusage); 0 where unavailable.
int64_t host_peak_rss_bytes();

struct DeviceMemory {
  int64_t allocated_bytes = 0;       // held by live tensors on this rank's device
  int64_t reserved_bytes = 0;        // held by the caching allocator
  int64_t peak_allocated_bytes = 0;  // since start or the last peak reset
  int64_t max_allocated_bytes = 0;   // since start, across peak resets (device_memory() fills it)
  int64_t free_bytes = 0;            // free on the device (outside the caching allocator)
  int64_t total_bytes = 0;           // the device's capacity
};

// Returns this rank's device memory, or nullopt when there is no device.
using DeviceMemoryProbe = std::function<std::optional<DeviceMemory>()>;

// Process-wide slot: the CUDA library (or a program) installs a probe at start-up;
// an empty function clears it.
void set_device_memory_probe(DeviceMemoryProbe probe);
// The installed probe's answer; nullopt when none is installed or it has no device.
std::optional<DeviceMemory> device_memory();

// The probe's companion: starts a new peak, so that the next answer's
// peak_allocated_bytes is the most allocated since this call (the CUDA
// allocator's resetPeakStats). Gemini's auto policy traces the peak of each
// segment of its warm-up step this way, not only the bytes at its boundaries.
using DeviceMemoryPeakReset = std::function<void()>;
void set_device_memory_peak_reset(DeviceMemoryPeakReset reset);
// The installed reset; a no-op when none is installed. The peak it clears
// is carried into max_allocated_bytes, so reports "since start" stay whole.
void reset_device_memory_peak();
// Whether a reset is installed (without one, peak_allocated_bytes counts
// from the start and says nothing about a stretch of the step).
bool device_memory_peak_resettable();

}  // namespace colossus::metrics
