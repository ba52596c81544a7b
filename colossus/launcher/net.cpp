#include "colossus/launcher/net.h"

#include "colossus/core/errors.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace colossus::launcher {

namespace {

sockaddr_in ipv4_address(const std::string& address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    throw LaunchError(fmt::format("'{}' is not an IPv4 address", address));
  }
  return addr;
}

Fd tcp_socket() {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw LaunchError(fmt::format("cannot create a TCP socket: {}", std::strerror(errno)));
  return fd;
}

}  // namespace

int free_port() {
  Fd fd = tcp_socket();
  sockaddr_in addr = ipv4_address("0.0.0.0", 0);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw LaunchError(fmt::format("cannot find a free port: bind failed: {}", std::strerror(errno)));
  }
  socklen_t length = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  return ntohs(addr.sin_port);
}

bool port_in_use(int port) {
  Fd fd = tcp_socket();
  // SO_REUSEADDR: a port left in TIME_WAIT by an earlier job is usable, only a
  // live socket on it makes the bind fail.
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = ipv4_address("0.0.0.0", port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return false;
  return errno == EADDRINUSE;
}

Fd listen_tcp(const std::string& bind_address, int* port) {
  Fd fd = tcp_socket();
  sockaddr_in addr = ipv4_address(bind_address, 0);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd.get(), 256) != 0) {
    throw LaunchError(fmt::format("cannot listen on {}: {}", bind_address, std::strerror(errno)));
  }
  socklen_t length = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  *port = ntohs(addr.sin_port);
  return fd;
}

Fd connect_tcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) throw LaunchError(fmt::format("cannot resolve host '{}': {}", host, ::gai_strerror(rc)));
  std::string last_error = "no address";
  for (addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    Fd fd(::socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC, entry->ai_protocol));
    if (!fd.valid()) continue;
    int rc_connect;
    do {
      rc_connect = ::connect(fd.get(), entry->ai_addr, entry->ai_addrlen);
    } while (rc_connect != 0 && errno == EINTR);
    if (rc_connect == 0) {
      ::freeaddrinfo(found);
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    last_error = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  throw LaunchError(fmt::format("cannot connect to {}:{}: {}", host, port, last_error));
}

Fd accept_tcp(int listener) {
  while (true) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Fd(fd);
    }
    if (errno == EINTR) continue;
    return Fd();
  }
}

std::string local_hostname() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "localhost";
  return buffer;
}

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  std::string own = local_hostname();
  std::string own_short = own.substr(0, own.find('.'));
  if (host == own || host == own_short) return true;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return false;
  bool local = false;
  for (ifaddrs* entry = interfaces; entry != nullptr && !local; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (entry->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof(text));
    } else if (entry->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(entry->ifa_addr)->sin6_addr, text, sizeof(text));
    } else {
      continue;
    }
    local = host == text;
  }
  ::freeifaddrs(interfaces);
  return local;
}

}  // namespace colossus::launcher
