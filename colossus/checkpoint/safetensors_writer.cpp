// save_safetensors: header first (computed from shapes and dtypes alone), then
// each tensor's bytes. Tensors are laid out in the safetensors package's order
// (larger dtypes first, then by name) so that, with the header padded to 8
// bytes, every tensor starts aligned for its dtype and the bytes match
// Python's save_file for the same tensors.
#include "colossus/checkpoint/safetensors_writer.h"

#include "colossus/checkpoint/dtypes.h"
#include "colossus/core/errors.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

namespace colossus::checkpoint {

namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void bad_tensor(const std::string& path, const std::string& name, std::string_view what) {
  throw CheckpointError(fmt::format("saving safetensors file '{}', tensor '{}': {}", path, name, what));
}

struct Planned {
  const std::string* name;
  const at::Tensor* tensor;
  DtypeInfo dtype;
  uint64_t bytes;
};

DtypeInfo checked_dtype(const std::string& path, const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined()) bad_tensor(path, name, "tensor is undefined");
  if (tensor.layout() != at::kStrided) bad_tensor(path, name, "only dense (strided) tensors can be saved");
  if (tensor.is_meta()) bad_tensor(path, name, "tensor is on the meta device and has no data");
  auto info = dtype_from_scalar_type(tensor.scalar_type());
  if (!info) {
    bad_tensor(path, name,
               fmt::format("dtype {} has no safetensors equivalent; supported: {}", c10::toString(tensor.scalar_type()),
                           supported_dtype_names()));
  }
  return *info;
}

std::vector<Planned> plan(const std::string& path, const NamedTensors& tensors) {
  std::vector<Planned> planned;
  planned.reserve(tensors.size());
  std::set<std::string_view> seen;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") bad_tensor(path, name, "the name is reserved for the header's metadata");
    if (!seen.insert(name).second) bad_tensor(path, name, "the name appears twice");
    DtypeInfo info = checked_dtype(path, name, tensor);
    planned.push_back({&name, &tensor, info, static_cast<uint64_t>(tensor.numel()) * info.itemsize});
  }
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    if (a.dtype.layout_rank != b.dtype.layout_rank) return a.dtype.layout_rank > b.dtype.layout_rank;
    return *a.name < *b.name;
  });
  return planned;
}

std::string encode_header(const std::string& path, const std::vector<Planned>& planned,
                          const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& item : planned) {
    Json entry = Json::object();
    entry["dtype"] = item.dtype.name;
    entry["shape"] = item.tensor->sizes().vec();
    entry["data_offsets"] = {offset, offset + item.bytes};
    header[*item.name] = std::move(entry);
    offset += item.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format(
        "saving safetensors file '{}': a tensor name or metadata entry is not valid UTF-8 ({})", path, e.what()));
  }
  // Spaces, as the reference writer pads: JSON ignores them and the data
  // region then starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

int64_t stored_bytes(const std::string& path, const std::string& name, const at::Tensor& tensor) {
  return tensor.numel() * checked_dtype(path, name, tensor).itemsize;
}

void write_safetensors(io::TempFile& out, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string& path = out.final_path();
  std::vector<Planned> planned = plan(path, tensors);
  std::string header = encode_header(path, planned, metadata);
  uint64_t header_bytes = header.size();
  out.write(&header_bytes, sizeof(header_bytes));  // little-endian host (checked by the reader)
  out.write(header.data(), header.size());
  for (const auto& item : planned) {
    if (item.bytes == 0) continue;
    at::Tensor cpu;
    try {
      // resolve_conj/neg: contiguous() keeps lazy conjugate/negative bits,
      // which the raw bytes would not carry.
      cpu = item.tensor->detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
    } catch (const c10::Error& e) {
      bad_tensor(path, *item.name, fmt::format("cannot copy to CPU: {}", e.what_without_backtrace()));
    }
    out.write(cpu.const_data_ptr(), item.bytes);
  }
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  io::TempFile out(path, io::temp_path_for(path));
  write_safetensors(out, tensors, metadata);
  out.publish();
}

}  // namespace colossus::checkpoint
