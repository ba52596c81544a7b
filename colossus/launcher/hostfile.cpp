#include "colossus/launcher/hostfile.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace colossus::launcher {

namespace {

std::string trim(const std::string& text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

bool valid_host_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
    if (!ok) return false;
  }
  return true;
}

int parse_slots(const std::string& text, const std::string& host, const std::string& where) {
  bool digits = !text.empty() && text.size() <= 9;
  for (char c : text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  int slots = digits ? std::stoi(text) : 0;
  if (slots < 1) {
    throw ConfigError(
        fmt::format("{}: bad slot count '{}' for host '{}'; expected a positive integer", where, text, host));
  }
  return slots;
}

std::string host_names(const std::vector<Host>& hosts) {
  std::string names;
  for (const auto& host : hosts) names += (names.empty() ? "" : ", ") + host.name;
  return names;
}

}  // namespace

std::vector<Host> parse_hostfile(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ConfigError(fmt::format("hostfile '{}' cannot be read: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << file.rdbuf();
  return parse_hostfile_text(text.str(), path);
}

std::vector<Host> parse_hostfile_text(const std::string& text, const std::string& source) {
  std::vector<Host> hosts;
  std::map<std::string, int> first_line;
  std::istringstream lines(text);
  std::string raw;
  int line_number = 0;
  while (std::getline(lines, raw)) {
    ++line_number;
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::string where = fmt::format("{}:{}", source, line_number);
    std::istringstream words(line);
    std::vector<std::string> tokens;
    for (std::string word; words >> word;) tokens.push_back(word);

    Host host;
    host.line = line_number;
    host.name = tokens[0];
    auto colon = host.name.find(':');
    if (colon != std::string::npos) {
      std::string count = host.name.substr(colon + 1);
      host.name = host.name.substr(0, colon);
      host.slots = parse_slots(count, host.name, where);
    }
    bool well_formed = valid_host_name(host.name) && tokens.size() <= 2;
    if (well_formed && tokens.size() == 2) {
      well_formed = !host.slots && tokens[1].rfind("slots=", 0) == 0;
      if (well_formed) host.slots = parse_slots(tokens[1].substr(6), host.name, where);
    }
    if (!well_formed) {
      throw ConfigError(
          fmt::format("{}: cannot parse '{}'; expected 'hostname', 'hostname slots=N' or 'hostname:N'", where, line));
    }
    auto [previous, inserted] = first_line.emplace(host.name, line_number);
    if (!inserted) {
      throw ConfigError(
          fmt::format("{}: host '{}' is listed twice (first on line {})", where, host.name, previous->second));
    }
    hosts.push_back(host);
  }
  if (hosts.empty()) throw ConfigError(fmt::format("hostfile '{}' lists no hosts", source));
  return hosts;
}

std::vector<std::string> split_host_list(const std::string& text) {
  std::vector<std::string> names;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    item = trim(item);
    if (!item.empty()) names.push_back(item);
  }
  return names;
}

std::vector<Host> select_hosts(const std::vector<Host>& hosts, const std::vector<std::string>& include,
                               const std::vector<std::string>& exclude, const std::string& source) {
  auto listed = [&](const std::string& name) {
    for (const auto& host : hosts) {
      if (host.name == name) return true;
    }
    return false;
  };
  for (const auto* names : {&include, &exclude}) {
    for (const auto& name : *names) {
      if (!listed(name)) {
        throw ConfigError(fmt::format("--{} names host '{}', which hostfile '{}' does not list (it lists: {})",
                                      names == &include ? "include" : "exclude", name, source, host_names(hosts)));
      }
    }
  }
  auto contains = [](const std::vector<std::string>& names, const std::string& name) {
    for (const auto& item : names) {
      if (item == name) return true;
    }
    return false;
  };
  std::vector<Host> selected;
  for (const auto& host : hosts) {
    if (!include.empty() && !contains(include, host.name)) continue;
    if (contains(exclude, host.name)) continue;
    selected.push_back(host);
  }
  if (selected.empty()) {
    throw ConfigError(
        fmt::format("no hosts left after --include/--exclude (hostfile '{}' lists: {})", source, host_names(hosts)));
  }
  return selected;
}

void check_slots(const std::vector<Host>& hosts, int nproc_per_node, const std::string& source) {
  for (const auto& host : hosts) {
    if (host.slots && *host.slots < nproc_per_node) {
      throw ConfigError(
          fmt::format("host '{}' has slots={} ({}:{}) but --nproc_per_node is {}; lower "
                      "--nproc_per_node or raise the slots",
                      host.name, *host.slots, source, host.line, nproc_per_node));
    }
  }
}

std::string mpi_hostfile_text(const std::vector<Host>& hosts, int nproc_per_node) {
  std::string text;
  for (const auto& host : hosts) text += fmt::format("{} slots={}\n", host.name, nproc_per_node);
  return text;
}

}  // namespace colossus::launcher
