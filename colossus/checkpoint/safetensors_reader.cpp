// SafetensorsFile: maps a .safetensors file and validates its header before
// any tensor is touched, so get() can hand out views without further checks.
// Layout: u64 little-endian header length N, N bytes of JSON, then the data
// region that every tensor's data_offsets [begin, end) index into.
// Acceptance follows the reference reader (the `safetensors` package): the
// tensors, sorted by offsets, tile the data region exactly, with no gap, no
// overlap and no trailing byte, so a header length that is off by one is
// refused instead of shifting every tensor. tests/checkpoint/
// differential_fuzz_test.cpp checks that whatever it refuses, we refuse.
// Errors never quote the file's bytes (a path may point at any file): they
// give positions, sizes and JSON types, and tensor names only sanitised.
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
#include <cctype>
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

// A name from the file, fit for an error message: printable ASCII kept,
// other bytes as \xNN, at most 96 characters.
std::string printable(std::string_view text) {
  constexpr std::size_t kMax = 96;
  std::string out;
  for (std::size_t i = 0; i < text.size() && out.size() < kMax; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (out.size() >= kMax) out += "...";
  return out;
}

// A JSON value from the file in an error: numbers as written, anything else
// by its type only.
std::string describe_value(const Json& value) {
  if (value.is_number()) return value.dump();
  return fmt::format("a JSON {}", value.type_name());
}

[[noreturn]] void bad_tensor(const std::string& path, const std::string& name, std::string_view what) {
  throw CheckpointError(fmt::format("safetensors file '{}', tensor '{}': {}", path, printable(name), what));
}

// nlohmann keeps the last of duplicate keys silently; a header with two
// entries for one name is ambiguous, so we find duplicates while parsing.
Json parse_header(const std::string& path, std::string_view text) {
  // nlohmann stops at a NUL as at the end of input, so "{...}\0junk" would
  // parse; the reference refuses it (a NUL is never valid JSON text).
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    bad_file(path, fmt::format("header of {} bytes has a NUL byte at byte {}", text.size(), nul));
  }
  // nlohmann skips a UTF-8 byte-order mark; JSON (and the reference) does not.
  if (text.starts_with("\xEF\xBB\xBF")) bad_file(path, "header starts with a UTF-8 byte-order mark");
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
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() quotes the bytes last read; the position is enough.
    bad_file(path, fmt::format("header of {} bytes is not valid JSON (syntax error at byte {})", text.size(), e.byte));
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, fmt::format("header of {} bytes is not valid JSON (error {})", text.size(), e.id));
  }
  if (!header.is_object()) bad_file(path, fmt::format("header is a JSON {}, expected an object", header.type_name()));
  if (!duplicate.empty()) bad_file(path, fmt::format("header has the key '{}' twice", printable(duplicate)));
  return header;
}

uint64_t unsigned_field(const std::string& path, const std::string& name, const Json& value, std::string_view what) {
  if (!value.is_number_unsigned()) {
    bad_tensor(path, name, fmt::format("{} must be a non-negative integer, got {}", what, describe_value(value)));
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
    // Quoted only when it looks like a dtype name (a short identifier).
    const auto& text = dtype->get_ref<const std::string&>();
    const bool identifier = !text.empty() && text.size() <= 16 && std::all_of(text.begin(), text.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    bad_tensor(path, name,
               fmt::format("unknown dtype {}; supported: {}",
                           identifier ? "\"" + text + "\"" : fmt::format("(a string of {} bytes)", text.size()),
                           supported_dtype_names()));
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
      bad_tensor(path, name, fmt::format("shape of {} dims has too many elements", shape->size()));
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
        fmt::format("{} [{}] needs {} elements x {} bytes, but data_offsets [{}, {}] span {} bytes", entry.dtype.name,
                    fmt::join(entry.shape, ", "), numel, entry.dtype.itemsize, entry.begin, entry.end,
                    entry.end - entry.begin));
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
      std::vector<std::string> some;
      for (std::size_t i = 0; i < entries.size() && i < 8; ++i) some.push_back(printable(entries[i].name));
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
          bad_file(path, fmt::format("__metadata__ value of '{}' is a JSON {}, expected a string", printable(key),
                                     item.type_name()));
        }
        impl->metadata.emplace(key, item.get<std::string>());
      }
      continue;
    }
    impl->entries.push_back(parse_entry(path, name, value, data_bytes));
  }

  // The reference reader's rule: sorted by (begin, end), each tensor starts
  // where the previous one ended (empty tensors included), and the last one
  // ends where the file does.
  std::stable_sort(impl->entries.begin(), impl->entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const auto& entry : impl->entries) {
    if (entry.begin != covered) {
      const bool overlap = entry.begin < covered;
      bad_tensor(path, entry.name,
                 fmt::format("bytes [{}, {}) {} {}; the tensors must tile the data region without gaps or overlaps",
                             entry.begin, entry.end, overlap ? "overlap" : "leave a gap after",
                             previous == nullptr ? std::string("the start of the data region")
                                                 : fmt::format("tensor '{}' at [{}, {})", printable(previous->name),
                                                               previous->begin, previous->end)));
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_bytes) {
    bad_file(path, fmt::format("the tensors cover {} bytes but the data region after the {}-byte header has {}: the "
                               "header length is wrong or bytes were appended",
                               covered, header_bytes, data_bytes));
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
  // The view keeps the mapping alive; when its last reference dies, its pages
  // leave this process's RSS (a loader that copied or sliced it is done).
  const auto bytes = static_cast<std::size_t>(entry.end - entry.begin);
  auto release_when_done = [mapping = impl_->mapping, data, bytes](void*) { mapping->release(data, bytes); };
  return at::from_blob(const_cast<std::byte*>(data), entry.shape, release_when_done, options);
}

c10::ScalarType SafetensorsFile::dtype(const std::string& name) const { return impl_->entry(name).dtype.scalar_type; }

std::vector<int64_t> SafetensorsFile::shape(const std::string& name) const { return impl_->entry(name).shape; }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

}  // namespace colossus::checkpoint
