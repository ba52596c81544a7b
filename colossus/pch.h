// Precompiled header shared by every Colossus target: ATen and the c10d
// backend interface, which most translation units need. <torch/torch.h> stays
// out (the nn/optim front end is included only where a module uses it).
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>
