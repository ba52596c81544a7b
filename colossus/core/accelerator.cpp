#include "colossus/core/accelerator.h"

namespace colossus {

namespace {
std::function<AcceleratorInfo()>& probe_slot() {
  static std::function<AcceleratorInfo()> probe;
  return probe;
}
}  // namespace

void register_accelerator_probe(std::function<AcceleratorInfo()> probe) { probe_slot() = std::move(probe); }

std::optional<AcceleratorInfo> probe_accelerator() {
  if (!probe_slot()) return std::nullopt;
  return probe_slot()();
}

}  // namespace colossus
