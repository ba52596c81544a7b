// Internal to the checkpoint layer: the safetensors encoder behind
// save_safetensors, exposed so the sharded writer can put shards under names
// of its choosing before it publishes them.
#pragma once
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/safetensors.h"

#include <map>
#include <string>

namespace colossus::checkpoint {

// Writes a complete safetensors file into `out` (not yet published). Tensors
// are moved to CPU one at a time, so at most one extra copy is alive. Throws
// CheckpointError naming `out.final_path()` and the tensor.
void write_safetensors(io::TempFile& out, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata);

// Bytes of a tensor's data as stored (numel x itemsize); throws for a dtype
// safetensors cannot store, naming `path` and `name`.
int64_t stored_bytes(const std::string& path, const std::string& name, const at::Tensor& tensor);

}  // namespace colossus::checkpoint
