// The OpenAI-compatible HTTP server (cpp-httplib): /v1/completions,
// /v1/chat/completions (JSON or server-sent events), /v1/models, /health and
// /metrics (Prometheus text) over one InferenceEngine driven by an EngineLoop.
// Handler threads parse and tokenize; the loop thread alone touches the engine.
// Under tensor parallelism this is rank 0; the other ranks run follow_steps().
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/inference/engine/engine.h"
#include "colossus/inference/serving/chat_prompt.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::inference::serving {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0 = any free port (port() tells which)
  std::string served_model_name = "";  // the `model` requests must name
  int64_t max_context = 0;            // positions the model has (0 = unbounded)
  int threads = 0;                    // HTTP worker threads (each holds one connection); 0 = max(16, 2 x max_batch_size)
  // Open connections (served or waiting for a worker) beyond which new ones
  // get 503 at once; 0 = 4 x threads.
  int max_connections = 0;
  // A connection must deliver a whole request (headers and body) within this
  // many seconds of opening or of its last response, or it is cut (408).
  double request_timeout_s = 10;
  bool log_requests = true;           // one line per finished request
  // When set, every route but /health needs `Authorization: Bearer <api_key>` (401 otherwise).
  std::string api_key = "";
  // A request that carries an Origin header (a browser page) is refused (403)
  // unless its origin is listed here; "*" allows every origin.
  std::vector<std::string> allowed_origins = {};
};

class Server {
 public:
  // With engine->config().tp_size > 1, tp_group is the engine's group and
  // this process its rank 0: the engine loop broadcasts each step's changes
  // to the other ranks (tensor_parallel_steps.h), which must be in
  // follow_steps() for as long as this server lives.
  Server(std::unique_ptr<InferenceEngine> engine, ChatPrompt chat, ServerOptions options,
         cluster::ProcessGroupPtr tp_group = nullptr);
  ~Server();

  // Binds the socket; throws ConfigError when it cannot. Returns the port.
  int bind();
  // Serves until stop(); in-flight non-streaming requests finish, open
  // streams end. Then stops the engine loop.
  void listen();
  // Any thread (not a signal handler): stops accepting and unblocks listen().
  void stop();
  int port() const { return port_; }
  // Set when a tensor-parallel step failed, which stops the server (listen()
  // returns): the ranks' engines no longer agree, so the job must end.
  std::optional<std::string> failure() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace colossus::inference::serving
