// The little TCP the launcher needs: a free port for MASTER_PORT, a check that
// a chosen port is not taken, the rank channel's listener and connection, and
// whether a host name means this machine.
#pragma once
#include "colossus/launcher/fd.h"

#include <string>

namespace colossus::launcher {

// A port the kernel says is free now (bind to port 0 and read it back).
int free_port();
// True when a listener (such as another job's store) already holds `port`.
bool port_in_use(int port);

// A listening socket on bind_address ("127.0.0.1" or "0.0.0.0"), port chosen
// by the kernel and returned in *port.
Fd listen_tcp(const std::string& bind_address, int* port);
// Throws LaunchError naming host, port and the reason.
Fd connect_tcp(const std::string& host, int port);
// A connection from a listener, or an invalid Fd when none is pending.
Fd accept_tcp(int listener);

std::string local_hostname();
// localhost, loopback addresses, this machine's host name (short or full) or
// an address of one of its interfaces. No DNS lookups: they can hang.
bool is_local_host(const std::string& host);

}  // namespace colossus::launcher
