// The server's HTTP workers: httplib's task queue, replaced so that the
// server bounds what clients can hold. httplib hands over each accepted
// connection as an opaque task; the pool finds the connection's socket (the
// one new socket of our port in /proc/self/fd) so that it can
//  - refuse a connection beyond `max_connections` (served or waiting for a
//    worker) with a 503 at once, instead of queueing it without bound;
//  - cut a connection that has not delivered a whole request within
//    `request_timeout` of its start or of its last response (a client that
//    trickles its headers a byte at a time otherwise holds a worker forever:
//    httplib's read timeout restarts with every byte).
// A request's handler and its response (a long stream too) have no deadline.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace colossus::inference::serving {

struct ConnectionLimits {
  int threads = 16;          // workers, each serving one connection at a time
  int max_connections = 64;  // open connections, served or queued for a worker
  std::chrono::milliseconds request_timeout{10'000};
};

class ConnectionPool final : public httplib::TaskQueue {
 public:
  // `port`: the server's bound port, to tell its accepted sockets from others.
  ConnectionPool(ConnectionLimits limits, int port);
  ~ConnectionPool() override;

  // httplib's accept thread, right after accept(): `task` serves and closes the new socket.
  void enqueue(std::function<void()> task) override;
  // Serves what is queued, then joins the workers (httplib calls it once listen ends).
  void shutdown() override;

  // From a handler's worker thread: its request was read (the deadline stops) /
  // its response was written (the deadline restarts for the next request on
  // the connection). No-ops on other threads.
  static void request_started();
  static void response_written();

  int64_t refused() const { return refused_; }
  int64_t timed_out() const { return timed_out_; }

 private:
  struct Connection;

  void work();
  void watch();
  std::shared_ptr<Connection> find_new_socket();
  void refuse(const Connection& connection);

  // The connection the calling worker thread serves, and its pool's mutex.
  static thread_local std::shared_ptr<Connection> current_;
  static thread_local std::mutex* current_mutex_;

  const ConnectionLimits limits_;
  const int port_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable stop_watch_;
  std::deque<std::pair<std::shared_ptr<Connection>, std::function<void()>>> queue_;
  std::vector<std::shared_ptr<Connection>> open_;  // queued or being served
  std::vector<std::thread> workers_;
  std::thread watchdog_;
  bool stopping_ = false;        // workers finish the queue and end
  bool stop_watching_ = false;  // after the workers
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> timed_out_{0};
  std::chrono::steady_clock::time_point last_refusal_log_{};
};

}  // namespace colossus::inference::serving
