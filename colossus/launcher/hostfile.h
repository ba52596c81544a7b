// Hostfiles in the Colossal-AI style: one host per line as `hostname`,
// `hostname slots=N` or `hostname:N`; `#` starts a comment; blank lines are
// skipped. --include/--exclude pick hosts by name.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace colossus::launcher {

struct Host {
  std::string name{};
  std::optional<int> slots{};  // ranks the host can take; unset: no limit given
  int line = 0;                // where it came from, for messages
};

// Throws ConfigError naming the file and line: unreadable file, malformed
// line, bad slot count, a host listed twice, no hosts at all.
std::vector<Host> parse_hostfile(const std::string& path);
// Same, from text (`source` names it in messages).
std::vector<Host> parse_hostfile_text(const std::string& text, const std::string& source);

// "a,b, c" -> {"a","b","c"}; empty items are dropped.
std::vector<std::string> split_host_list(const std::string& text);

// Keeps the hosts named in `include` (all when empty), then drops those in
// `exclude`, in hostfile order. Throws ConfigError for a name the hostfile
// does not list, or when no host is left.
std::vector<Host> select_hosts(const std::vector<Host>& hosts, const std::vector<std::string>& include,
                               const std::vector<std::string>& exclude, const std::string& source);

// Throws ConfigError when a host's slots cannot hold nproc_per_node ranks.
void check_slots(const std::vector<Host>& hosts, int nproc_per_node, const std::string& source);

// The hostfile mpirun gets: "name slots=N" per host, N = nproc_per_node, so
// by-slot mapping puts ranks node_index*N .. node_index*N+N-1 on host i.
std::string mpi_hostfile_text(const std::vector<Host>& hosts, int nproc_per_node);

}  // namespace colossus::launcher
