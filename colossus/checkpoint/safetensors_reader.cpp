// SafetensorsFile: maps a .safetensors file and validates its header before
// any tensor is touched, so get() can hand out views without further checks.
// Layout: u64 little-endian header length N, N bytes of JSON, then the data
// region that every tensor's data_offsets [begin, end) index into.
#include "colossus/checkpoint/dtypes.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

namespace colossus::checkpoint {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace {

using Json = nlohmann::ordered_json;

// The reference implementation's limit; a longer header is a corrupt length.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  DtypeInfo dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data region
  uint64_t end = 0;
  int64_t numel = 0;
};

[[noreturn]] void bad_file(const std::string& path, std::string_view what) {
  throw CheckpointError(fmt::format("safetensors file '{}': {}", path, what));
}

[[noreturn]] void bad_tensor(const std::string& path, const std::string& name, std::string_view what) {
  throw CheckpointError(fmt::format("safetensors file '{}', tensor '{}': {}", path, name, what));
}

// nlohmann keeps the last of duplicate keys silently; a header with two
// entries for one name is ambiguous, so we find duplicates while parsing.
Json parse_header(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto on_event = [&](int /*depth*/, nlohmann::json::parse_event_t event, Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Event::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) bad_file(path, fmt::format("header is a JSON {}, expected an object", header.type_name()));
  if (!duplicate.empty()) bad_file(path, fmt::format("header has the key '{}' twice", duplicate));
  return header;
}

uint64_t unsigned_field(const std::string& path, const std::string& name, const Json& value, std::string_view what) {
  if (!value.is_number_unsigned()) {
    bad_tensor(path, name, fmt::format("{} must be a non-negative integer, got {}", what, value.dump()));
  }
  return value.get<uint64_t>();
}

TensorEntry parse_entry(const std::string& path, const std::string& name, const Json& value, uint64_t data_bytes) {
  // Fields other than these three are ignored, as the reference reader does.
  if (!value.is_object())
    bad_tensor(path, name, fmt::format("entry is a JSON {}, expected an object", value.type_name()));
  TensorEntry entry;
  entry.name = name;

  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) bad_tensor(path, name, "entry has no \"dtype\" string");
  auto info = dtype_from_name(dtype->get_ref<const std::string&>());
  if (!info) {
    bad_tensor(path, name, fmt::format("unknown dtype {}; supported: {}", dtype->dump(), supported_dtype_names()));
  }
  entry.dtype = *info;

  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) bad_tensor(path, name, "entry has no \"shape\" array");
  // numel of the non-zero dims must fit int64, so torch's size and stride
  // arithmetic cannot overflow even for a tensor with a zero dim.
  uint64_t nonzero_product = 1;
  bool has_zero_dim = false;
  for (const auto& dim_json : *shape) {
    uint64_t dim = unsigned_field(path, name, dim_json, "every shape dim");
    if (dim == 0) {
      has_zero_dim = true;
    } else if (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
               nonzero_product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      bad_tensor(path, name, fmt::format("shape {} has too many elements", shape->dump()));
    }
    entry.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t numel = has_zero_dim ? 0 : nonzero_product;

  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
    bad_tensor(path, name, "entry has no \"data_offsets\" [begin, end] pair");
  }
  entry.begin = unsigned_field(path, name, (*offsets)[0], "data_offsets begin");
  entry.end = unsigned_field(path, name, (*offsets)[1], "data_offsets end");
  if (entry.begin > entry.end) {
    bad_tensor(path, name, fmt::format("data_offsets [{}, {}] has begin after end", entry.begin, entry.end));
  }
  if (entry.end > data_bytes) {
    bad_tensor(
        path, name,
        fmt::format("data_offsets [{}, {}] run past the data region of {} bytes", entry.begin, entry.end, data_bytes));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(entry.dtype.itemsize), &bytes) ||
      bytes != entry.end - entry.begin) {
    bad_tensor(
        path, name,
        fmt::format("{} {} needs {} elements x {} bytes, but data_offsets [{}, {}] span {} bytes", entry.dtype.name,
                    shape->dump(), numel, entry.dtype.itemsize, entry.begin, entry.end, entry.end - entry.begin));
  }
  entry.numel = static_cast<int64_t>(numel);
  return entry;
}

}  // namespace

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const io::MappedFile> mapping;
  uint64_t data_start = 0;           // file offset of the data region
  std::vector<TensorEntry> entries;  // file order: by data offset
  std::unordered_map<std::string, std::size_t> by_name;
  std::map<std::string, std::string> metadata;

  const TensorEntry& entry(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::vector<std::string_view> some;
      for (std::size_t i = 0; i < entries.size() && i < 8; ++i) some.push_back(entries[i].name);
      bad_tensor(path, name,
                 fmt::format("no such tensor; the file has {} tensors ({}{})", entries.size(), fmt::join(some, ", "),
                             entries.size() > some.size() ? ", ..." : ""));
    }
    return entries[it->second];
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->mapping = io::MappedFile::map(path);
  const std::size_t file_bytes = impl->mapping->size();
  if (file_bytes < 8) {
    bad_file(path, fmt::format("file is {} bytes, too short for the 8-byte header length", file_bytes));
  }
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, impl->mapping->data(), 8);
  if (header_bytes > file_bytes - 8) {
    bad_file(path, fmt::format("header length {} runs past the end of the file ({} bytes)", header_bytes, file_bytes));
  }
  if (header_bytes > kMaxHeaderBytes) {
    bad_file(path, fmt::format("header length {} exceeds the limit of {} bytes", header_bytes, kMaxHeaderBytes));
  }
  impl->data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - impl->data_start;

  auto text = std::string_view(reinterpret_cast<const char*>(impl->mapping->data()) + 8, header_bytes);
  Json header = parse_header(path, text);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) bad_file(path, "__metadata__ must be a JSON object of strings");
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          bad_file(path,
                   fmt::format("__metadata__ value of '{}' is a JSON {}, expected a string", key, item.type_name()));
        }
        impl->metadata.emplace(key, item.get<std::string>());
      }
      continue;
    }
    impl->entries.push_back(parse_entry(path, name, value, data_bytes));
  }

  std::stable_sort(impl->entries.begin(), impl->entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorEntry* previous = nullptr;  // the last non-empty range
  for (const auto& entry : impl->entries) {
    if (entry.begin == entry.end) continue;
    if (previous != nullptr && entry.begin < previous->end) {
      bad_tensor(path, entry.name,
                 fmt::format("bytes [{}, {}) overlap tensor '{}' at [{}, {})", entry.begin, entry.end, previous->name,
                             previous->begin, previous->end));
    }
    previous = &entry;
  }
  for (std::size_t i = 0; i < impl->entries.size(); ++i) impl->by_name.emplace(impl->entries[i].name, i);
  return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const { return impl_->path; }

std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> names;
  names.reserve(impl_->entries.size());
  for (const auto& entry : impl_->entries) names.push_back(entry.name);
  return names;
}

bool SafetensorsFile::contains(const std::string& name) const { return impl_->by_name.contains(name); }

at::Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorEntry& entry = impl_->entry(name);
  auto options = at::TensorOptions().dtype(entry.dtype.scalar_type).device(at::kCPU);
  if (entry.numel == 0) return at::empty(entry.shape, options);
  const std::byte* data = impl_->mapping->data() + impl_->data_start + entry.begin;
  // Other writers need not align tensors (the header length need not be a
  // multiple of 8), and torch kernels assume aligned elements: copy those.
  if (reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(entry.dtype.itemsize) != 0) {
    at::Tensor copy = at::empty(entry.shape, options);
    std::memcpy(copy.data_ptr(), data, entry.end - entry.begin);
    return copy;
  }
  auto keep_mapping_alive = [mapping = impl_->mapping](void*) {};
  return at::from_blob(const_cast<std::byte*>(data), entry.shape, keep_mapping_alive, options);
}

c10::ScalarType SafetensorsFile::dtype(const std::string& name) const { return impl_->entry(name).dtype.scalar_type; }

std::vector<int64_t> SafetensorsFile::shape(const std::string& name) const { return impl_->entry(name).shape; }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

}  // namespace colossus::checkpoint
