#include "colossus/data/normalizer.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace colossus::data {

namespace {

using nlohmann::json;

const char* form_name(UnicodeForm form) {
  switch (form) {
    case UnicodeForm::kNfc: return "NFC";
    case UnicodeForm::kNfd: return "NFD";
    case UnicodeForm::kNfkc: return "NFKC";
    case UnicodeForm::kNfkd: return "NFKD";
  }
  return "?";
}

void read_forms(const json& node, const std::string& path, std::vector<UnicodeForm>& forms) {
  if (node.is_null()) return;
  const std::string type = node.is_object() && node.contains("type") && node["type"].is_string()
                               ? node["type"].get<std::string>()
                               : std::string();
  if (type == "Sequence") {
    const auto it = node.find("normalizers");
    if (it == node.end() || !it->is_array()) {
      throw ConfigError(fmt::format("{}: normalizer Sequence needs a \"normalizers\" list; got {}", path,
                                    node.dump().substr(0, 200)));
    }
    for (const json& part : *it) read_forms(part, path, forms);
    return;
  }
  for (UnicodeForm form : {UnicodeForm::kNfc, UnicodeForm::kNfd, UnicodeForm::kNfkc, UnicodeForm::kNfkd}) {
    if (type == form_name(form)) {
      forms.push_back(form);
      return;
    }
  }
  throw ConfigError(fmt::format("{}: normalizer {} is not supported; supported: NFC, NFD, NFKC, NFKD and a Sequence "
                                "of them",
                                path, node.dump().substr(0, 200)));
}

}  // namespace

Normalizer Normalizer::from_json(const json& node, const std::string& path) {
  Normalizer normalizer;
  read_forms(node, path, normalizer.forms_);
  return normalizer;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (UnicodeForm form : forms_) {
    int options = UTF8PROC_STABLE;
    options |= form == UnicodeForm::kNfc || form == UnicodeForm::kNfkc ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (form == UnicodeForm::kNfkc || form == UnicodeForm::kNfkd) options |= UTF8PROC_COMPAT;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(out.data()), static_cast<utf8proc_ssize_t>(out.size()),
                     &mapped, static_cast<utf8proc_option_t>(options));
    const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
    if (length < 0) return std::string(text);  // not valid UTF-8
    out.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  }
  return out;
}

std::string Normalizer::describe() const {
  std::vector<std::string> parts;
  for (UnicodeForm form : forms_) parts.push_back(fmt::format(R"({{"type":"{}"}})", form_name(form)));
  if (parts.size() == 1) return parts.front();
  return fmt::format(R"({{"type":"Sequence","normalizers":[{}]}})", fmt::join(parts, ","));
}

}  // namespace colossus::data
