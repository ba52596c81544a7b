#include "colossus/inference/serving/connection_pool.h"

#include "colossus/cluster/logger.h"

#include <dirent.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace colossus::inference::serving {

namespace {

using Clock = std::chrono::steady_clock;

const cluster::Logger& logger() {
  static const cluster::Logger log("serve");
  return log;
}

// The local port of a socket, or -1 for anything else.
int local_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -1;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return -1;
}

bool is_listening(int fd) {
  int listening = 0;
  socklen_t size = sizeof(listening);
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening != 0;
}

ino_t inode_of(int fd) {
  struct stat info {};
  return ::fstat(fd, &info) == 0 && S_ISSOCK(info.st_mode) ? info.st_ino : 0;
}

void send_now(int fd, const std::string& bytes) {
  // Never blocks: what does not fit in the socket buffer is dropped.
  (void)::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

std::string plain_response(int status, const char* reason, const std::string& message) {
  const std::string body = fmt::format(
      R"({{"error":{{"message":"{}","type":"server_error","param":null,"code":null}}}})", message);
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n"
                     "{}\r\n{}",
                     status, reason, body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
}

}  // namespace

struct ConnectionPool::Connection {
  enum class State { Queued, AwaitingRequest, Handling, Done };
  int fd = -1;
  ino_t inode = 0;
  State state = State::Queued;
  Clock::time_point since{};
  bool cut = false;
};

thread_local std::shared_ptr<ConnectionPool::Connection> ConnectionPool::current_;
thread_local std::mutex* ConnectionPool::current_mutex_ = nullptr;

ConnectionPool::ConnectionPool(ConnectionLimits limits, int port) : limits_(limits), port_(port) {
  workers_.reserve(static_cast<size_t>(limits_.threads));
  for (int i = 0; i < limits_.threads; ++i) workers_.emplace_back([this] { work(); });
  watchdog_ = std::thread([this] { watch(); });
}

ConnectionPool::~ConnectionPool() { shutdown(); }

std::shared_ptr<ConnectionPool::Connection> ConnectionPool::find_new_socket() {
  // Sockets already known (their fd and inode: a closed fd's number is reused).
  std::vector<std::pair<int, ino_t>> known;
  {
    std::lock_guard lock(mutex_);
    for (const auto& c : open_) known.emplace_back(c->fd, c->inode);
  }
  std::shared_ptr<Connection> found;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return nullptr;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == ::dirfd(dir)) continue;
    const ino_t inode = inode_of(fd);
    if (inode == 0) continue;
    if (std::find(known.begin(), known.end(), std::make_pair(fd, inode)) != known.end()) continue;
    if (local_port(fd) != port_ || is_listening(fd)) continue;
    // Two unknown ones cannot both be this accept's; the newest socket has the highest inode.
    if (!found || inode > found->inode) {
      found = std::make_shared<Connection>();
      found->fd = fd;
      found->inode = inode;
    }
  }
  ::closedir(dir);
  return found;
}

void ConnectionPool::refuse(const Connection& connection) {
  send_now(connection.fd, plain_response(503, "Service Unavailable",
                                         fmt::format("the server has {} open connections, its limit "
                                                     "(--max_connections); retry shortly",
                                                     limits_.max_connections)));
  // Drop what the client already sent, so closing sends a FIN after the 503, not a reset.
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(connection.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  ::shutdown(connection.fd, SHUT_RDWR);
  ::close(connection.fd);
  ++refused_;
  const auto now = Clock::now();
  if (now - last_refusal_log_ > std::chrono::seconds(10)) {
    last_refusal_log_ = now;
    logger().warning(fmt::format("refusing new connections: {} are open (--max_connections {}); {} refused so far",
                                 limits_.max_connections, limits_.max_connections, refused_.load()));
  }
}

void ConnectionPool::enqueue(std::function<void()> task) {
  auto connection = find_new_socket();
  std::unique_lock lock(mutex_);
  if (connection && static_cast<int>(open_.size()) >= limits_.max_connections) {
    lock.unlock();
    // The task would only serve and close the socket: closed here instead, the task dropped unrun.
    refuse(*connection);
    return;
  }
  if (!connection) connection = std::make_shared<Connection>();  // not found: served, just not bounded
  else open_.push_back(connection);
  queue_.emplace_back(std::move(connection), std::move(task));
  ready_.notify_one();
}

void ConnectionPool::work() {
  while (true) {
    std::shared_ptr<Connection> connection;
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      connection = std::move(queue_.front().first);
      task = std::move(queue_.front().second);
      queue_.pop_front();
      connection->state = Connection::State::AwaitingRequest;
      connection->since = Clock::now();
    }
    current_ = connection;
    current_mutex_ = &mutex_;
    task();  // serves the connection, then closes its socket
    current_.reset();
    current_mutex_ = nullptr;
    std::lock_guard lock(mutex_);
    connection->state = Connection::State::Done;
    open_.erase(std::remove(open_.begin(), open_.end(), connection), open_.end());
  }
}

void ConnectionPool::request_started() {
  if (!current_) return;
  std::lock_guard lock(*current_mutex_);
  current_->state = Connection::State::Handling;
}

void ConnectionPool::response_written() {
  if (!current_) return;
  std::lock_guard lock(*current_mutex_);
  current_->state = Connection::State::AwaitingRequest;
  current_->since = Clock::now();
}

void ConnectionPool::watch() {
  std::unique_lock lock(mutex_);
  while (!stop_watching_) {
    stop_watch_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = Clock::now();
    for (const auto& c : open_) {
      if (c->state != Connection::State::AwaitingRequest || c->cut || c->fd < 0) continue;
      if (now - c->since < limits_.request_timeout) continue;
      // The task closes its socket before it marks the connection Done: a
      // number reused since by another socket has another inode.
      if (inode_of(c->fd) != c->inode) continue;
      c->cut = true;
      ++timed_out_;
      send_now(c->fd, plain_response(408, "Request Timeout",
                                     fmt::format("no complete request within {} ms; the connection is closed",
                                                 limits_.request_timeout.count())));
      ::shutdown(c->fd, SHUT_RDWR);
    }
  }
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  ready_.notify_all();
  // The watchdog keeps cutting slow clients while the workers drain the queue.
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  {
    std::lock_guard lock(mutex_);
    stop_watching_ = true;
  }
  stop_watch_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

}  // namespace colossus::inference::serving
