// Routes of the OpenAI-compatible server; see server.h. Streams are chunked
// responses whose content provider waits on the request's Channel; a write
// that fails (the client went away) ends the stream, and its releaser aborts
// the request so its KV blocks are freed.
#include "colossus/inference/serving/server.h"

#include "colossus/cluster/logger.h"
#include "colossus/core/errors.h"
#include "colossus/inference/serving/connection_pool.h"
#include "colossus/inference/serving/engine_loop.h"
#include "colossus/inference/serving/openai_api.h"
#include "colossus/inference/serving/server_metrics.h"

#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

namespace colossus::inference::serving {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const cluster::Logger& logger() {
  static const cluster::Logger log("serve");
  return log;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(dump_json(error_body(error)), "application/json");
}

enum class Kind { Completion, Chat };

bool valid_utf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return false;
    }
    i += length;
  }
  return true;
}

// What a stream's content provider carries between calls.
struct StreamState {
  std::shared_ptr<Channel> channel;
  Kind kind = Kind::Completion;
  std::string id;
  int64_t created = 0;
  std::string model;
  bool include_usage = false;
  bool with_logprobs = false;
  TokenText token_text;
  int64_t choices = 1;
  int64_t n = 1;  // choices per prompt: choice i runs prompt i / n
  bool started = false;
  bool complete = false;
  std::vector<int64_t> prompt_tokens;  // per choice, as its outputs report them
  int64_t completion_tokens = 0;
  std::string finish_reason;
  Clock::time_point start;

  // Usage as OpenAI's: each prompt counted once (not once per choice), every choice's tokens.
  int64_t usage_prompt_tokens() const {
    int64_t total = 0;
    for (size_t i = 0; i < prompt_tokens.size(); i += static_cast<size_t>(n)) total += prompt_tokens[i];
    return total;
  }
};

}  // namespace

struct Server::Impl {
  ServerOptions options;
  ChatPrompt chat;
  std::unique_ptr<EngineLoop> loop;
  httplib::Server http;
  Limits limits;
  SamplingParams defaults;
  int64_t created = unix_seconds();
  std::atomic<int64_t> next_id{1};
  std::mutex mutex;  // guards rng and http_counts
  std::mt19937_64 rng{std::random_device{}()};
  HttpCounts http_counts;
  std::atomic<bool> stop_sent{false};  // Server::stop() took effect
  int64_t tensor_parallel_size = 1;  // the engine's tp ranks (this is rank 0)

  uint64_t random_seed() {
    std::lock_guard lock(mutex);
    return rng();
  }
  void count(const std::string& endpoint, int status) {
    std::lock_guard lock(mutex);
    ++http_counts[{endpoint, status}];
  }
  std::string new_id(const char* prefix) { return fmt::format("{}-{:016x}", prefix, next_id++ * 0x9E3779B97F4A7C15ull); }

  void check_model(const std::string& model) const {
    if (model != options.served_model_name) {
      throw ApiError(404, fmt::format("the model '{}' does not exist; this server serves '{}'", model, options.served_model_name),
                     "model", "invalid_request_error", "model_not_found");
    }
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const {
    const data::Tokenizer* tokenizer = loop->tokenizer();
    if (!tokenizer) throw ApiError(400, "this model has no tokenizer: send the prompt as token ids", "prompt");
    const std::vector<int32_t> ids = tokenizer->encode(text, add_special_tokens);
    return {ids.begin(), ids.end()};
  }

  bool origin_allowed(const std::string& origin) const {
    const auto& allowed = options.allowed_origins;
    return std::find(allowed.begin(), allowed.end(), "*") != allowed.end() ||
           std::find(allowed.begin(), allowed.end(), origin) != allowed.end();
  }

  // The Origin of browser requests, then the API key (when the server has
  // one) on the OpenAI routes, as vLLM's: /health, /metrics (Prometheus
  // scrapes), /tokenize and /detokenize stay open.
  void check_access(const httplib::Request& req) const {
    if (req.has_header("Origin")) {
      const std::string origin = req.get_header_value("Origin");
      if (!origin_allowed(origin)) {
        throw ApiError(403,
                       fmt::format("requests from the web origin '{}' are refused; start the server with "
                                   "--allowed_origins {} to allow it",
                                   origin, origin),
                       {}, "invalid_request_error", "origin_not_allowed");
      }
    }
    if (options.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return;
    const std::string expected = "Bearer " + options.api_key;
    const std::string given = req.get_header_value("Authorization");
    // Compared in time independent of where they differ.
    unsigned char difference = given.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i) {
      difference |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
    }
    if (difference != 0) {
      throw ApiError(401, "missing or incorrect API key: send the header 'Authorization: Bearer <key>'", {},
                     "invalid_request_error", "invalid_api_key");
    }
  }

  // A failure of the server, not of the request: the details (which may name
  // files of this machine) go to the log under an id; the client gets the id.
  void send_server_error(httplib::Response& res, int status, const std::string& path, const std::string& detail) {
    const std::string id = new_id("err");
    logger().error(fmt::format("{} failed ({}): {}", path, id, detail));
    send_error(res, ApiError(status, fmt::format("the server could not complete the request (logged as {})", id), {},
                             "server_error"));
  }

  // Wraps a handler: ApiError and ConfigError become OpenAI error bodies; every response is counted.
  void route(const char* method, const std::string& path,
             std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    auto wrapped = [this, path, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
      ConnectionPool::request_started();
      try {
        allow_origin(req, res);
        if (path != "/health") check_access(req);
        handler(req, res);
      } catch (const ApiError& e) {
        if (e.status < 500 || e.what() == std::string(kShuttingDown)) {
          send_error(res, e);
        } else {
          send_server_error(res, e.status, path, e.what());
        }
      } catch (const ConfigError& e) {
        send_error(res, ApiError(400, e.what()));
      } catch (const std::exception& e) {
        send_server_error(res, 500, path, e.what());
      }
      count(path, res.status == -1 ? 200 : res.status);
      if (res.status >= 400 && options.log_requests) {
        logger().info(fmt::format("{} {} {}: {}", req.method, path, res.status, res.body.substr(0, 300)));
      }
    };
    if (std::string(method) == "GET") http.Get(path, wrapped);
    else http.Post(path, wrapped);
    // A browser's CORS preflight: no key (browsers send none), the origin checked.
    http.Options(path, [this, method](const httplib::Request& req, httplib::Response& res) {
      ConnectionPool::request_started();
      if (!req.has_header("Origin") || !origin_allowed(req.get_header_value("Origin"))) {
        res.status = 403;
      } else {
        allow_origin(req, res);
        res.set_header("Access-Control-Allow-Methods", fmt::format("{}, OPTIONS", method));
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
        res.status = 204;
      }
    });
  }

  // CORS: a response to an allowed web origin says so, or the browser hides it from the page.
  void allow_origin(const httplib::Request& req, httplib::Response& res) const {
    if (!req.has_header("Origin")) return;
    const std::string origin = req.get_header_value("Origin");
    if (!origin_allowed(origin)) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    CompletionRequest request = parse_completion_request(req.body);
    check_model(request.generation.model);
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> echoes;  // each prompt's text, for echo
    int64_t longest = 0;
    for (Prompt& p : request.prompts) {
      prompts.push_back(p.text ? encode(*p.text, true) : std::move(p.ids));
      if (request.generation.echo) echoes.push_back(p.text ? *p.text : decode(prompts.back()));
      longest = std::max(longest, static_cast<int64_t>(prompts.back().size()));
    }
    const RequestOptions opts = request_options(request.generation, defaults, limits, longest, random_seed());
    generate(Kind::Completion, request.generation, std::move(prompts), opts, req, res, echoes);
  }

  std::string decode(const std::vector<int64_t>& ids) const {
    const data::Tokenizer* tokenizer = loop->tokenizer();
    if (!tokenizer) return {};
    return tokenizer->decode(std::vector<int32_t>(ids.begin(), ids.end()));
  }

  // A token as the logprobs objects name it: its text; "bytes:\\xNN..." (as
  // OpenAI writes them) when its bytes are not whole UTF-8 characters, so
  // tokens that are parts of one character stay distinct; "token_id:N"
  // without a tokenizer.
  TokenText token_text() const {
    const data::Tokenizer* tokenizer = loop->tokenizer();
    return [tokenizer](int64_t id) {
      if (!tokenizer) return fmt::format("token_id:{}", id);
      std::string text = tokenizer->decode({static_cast<int32_t>(id)});
      // A decoder writes U+FFFD for a part of a character: name its bytes.
      if (text.find("\xEF\xBF\xBD") == std::string::npos) return text;
      const auto raw = tokenizer->token_text(static_cast<int32_t>(id));
      if (!raw || valid_utf8(*raw)) return text;
      std::string escaped = "bytes:";
      for (unsigned char c : *raw) escaped += fmt::format("\\x{:02x}", c);
      return escaped;
    };
  }

  void chat_completions(const httplib::Request& req, httplib::Response& res) {
    ChatRequest request = parse_chat_request(req.body);
    check_model(request.generation.model);
    std::string text;
    try {
      text = chat.render(request.messages, request.add_generation_prompt, request.template_kwargs);
    } catch (const ConfigError& e) {
      throw ApiError(400, fmt::format("the chat template refused the messages: {}", e.what()), "messages");
    }
    std::vector<std::vector<int64_t>> prompts{encode(text, chat.add_special_tokens())};
    const auto longest = static_cast<int64_t>(prompts.front().size());
    const RequestOptions opts = request_options(request.generation, defaults, limits, longest, random_seed());
    generate(Kind::Chat, request.generation, std::move(prompts), opts, req, res);
  }

  // Each prompt runs request.n times (choice p * n + j), a sampled choice j
  // with its own seed (the request's seed + j, or a random one).
  void generate(Kind kind, const GenerationRequest& request, std::vector<std::vector<int64_t>> prompts,
                const RequestOptions& opts, const httplib::Request& req, httplib::Response& res,
                const std::vector<std::string>& echoes = {}) {
    const auto start = Clock::now();
    const auto n = static_cast<size_t>(request.n);
    std::vector<std::vector<int64_t>> runs;
    std::vector<RequestOptions> run_options;
    for (auto& prompt : prompts) {
      for (size_t j = 0; j < n; ++j) {
        runs.push_back(prompt);
        RequestOptions o = opts;
        if (j > 0 && o.sampling && !o.sampling->greedy()) {
          o.sampling->seed = request.seed ? *request.seed + j : random_seed();
        }
        run_options.push_back(std::move(o));
      }
    }
    const size_t num_choices = runs.size();
    std::shared_ptr<Channel> channel = loop->submit(runs, std::move(run_options));
    if (!channel->wait_admitted()) throw ApiError(400, channel->error().value_or("the request was refused"));
    const std::string id = new_id(kind == Kind::Chat ? "chatcmpl" : "cmpl");
    if (request.stream) {
      stream(kind, request, channel, id, start, res, static_cast<int64_t>(num_choices));
      return;
    }
    std::vector<ChoiceResult> choices(num_choices);
    for (size_t i = 0; i < num_choices; ++i) {
      ChoiceResult& choice = choices[i];
      choice.counts_prompt = i % n == 0;
      choice.with_logprobs = request.logprobs.has_value();
      if (!echoes.empty()) {
        choice.text = echoes[i / n];
        if (choice.with_logprobs) choice.first_prompt_token = runs[i].front();
      }
    }
    while (!channel->closed()) {
      for (ChoiceOutput& out : channel->wait(std::chrono::milliseconds(500))) {
        ChoiceResult& choice = choices[static_cast<size_t>(out.index)];
        choice.text += out.output.new_text;
        choice.prompt_tokens = out.output.prompt_tokens;
        choice.completion_tokens = out.output.generated_tokens;
        choice.logprobs.insert(choice.logprobs.end(), out.output.logprobs.begin(), out.output.logprobs.end());
        choice.prompt_logprobs.insert(choice.prompt_logprobs.end(), out.output.prompt_logprobs.begin(),
                                      out.output.prompt_logprobs.end());
        if (out.output.finished) choice.finish_reason = finish_reason_name(out.output.finish_reason);
      }
    }
    if (auto error = channel->error()) throw ApiError(503, *error, {}, "server_error");
    const json body = kind == Kind::Chat
                          ? chat_response(id, created_now(), options.served_model_name, choices, token_text())
                          : completion_response(id, created_now(), options.served_model_name, choices, token_text());
    res.set_content(dump_json(body), "application/json");
    log_finished(req.path, choices, start);
  }

  static int64_t created_now() { return unix_seconds(); }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_tokenize_body(req.body);
    std::vector<int64_t> ids;
    if (body.contains("messages")) {
      // As a chat request would render them (with the generation prompt by default).
      ChatRequest chat_request = parse_chat_request(json{{"model", options.served_model_name},
                                                         {"messages", body["messages"]},
                                                         {"add_generation_prompt", body.value("add_generation_prompt", true)}}
                                                        .dump());
      std::string text;
      try {
        text = chat.render(chat_request.messages, chat_request.add_generation_prompt, chat_request.template_kwargs);
      } catch (const ConfigError& e) {
        throw ApiError(400, fmt::format("the chat template refused the messages: {}", e.what()), "messages");
      }
      ids = encode(text, chat.add_special_tokens());
    } else {
      if (!body.contains("prompt") || !body["prompt"].is_string()) {
        throw ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt");
      }
      const json& special = body.contains("add_special_tokens") ? body["add_special_tokens"] : json(true);
      if (!special.is_boolean()) throw ApiError(400, "'add_special_tokens' must be a boolean", "add_special_tokens");
      ids = encode(body["prompt"].get<std::string>(), special.get<bool>());
    }
    res.set_content(dump_json({{"count", ids.size()}, {"max_model_len", options.max_context}, {"tokens", ids}}),
                    "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_tokenize_body(req.body);
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      throw ApiError(400, "'tokens' (a list of token ids) is required", "tokens");
    }
    if (!loop->tokenizer()) throw ApiError(400, "this model has no tokenizer to decode with", "tokens");
    std::vector<int64_t> ids;
    const int64_t vocab = loop->tokenizer()->vocab_size();
    for (const json& id : body["tokens"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
        throw ApiError(400, fmt::format("'tokens' holds {}, not a token id in [0, {})", id.dump(), vocab), "tokens");
      }
      ids.push_back(id.get<int64_t>());
    }
    res.set_content(dump_json({{"prompt", decode(ids)}}), "application/json");
  }

  // A JSON object whose "model", when given, is the served one.
  json parse_tokenize_body(const std::string& text) const {
    json body;
    try {
      body = json::parse(text);
    } catch (const json::parse_error& e) {
      throw ApiError(400, fmt::format("the request body is not valid JSON ({})", e.what()));
    }
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) throw ApiError(400, "'model' must be a string", "model");
      check_model(body["model"].get<std::string>());
    }
    return body;
  }

  void log_finished(const std::string& path, const std::vector<ChoiceResult>& choices, Clock::time_point start) const {
    if (!options.log_requests) return;
    int64_t prompt = 0, completion = 0;
    std::string reasons;
    for (const auto& c : choices) {
      prompt += c.prompt_tokens;
      completion += c.completion_tokens;
      reasons += (reasons.empty() ? "" : ",") + c.finish_reason;
    }
    logger().info(fmt::format("{} 200 prompt={} completion={} finish={} {:.2f}s", path, prompt, completion, reasons,
                              std::chrono::duration<double>(Clock::now() - start).count()));
  }

  void stream(Kind kind, const GenerationRequest& request, std::shared_ptr<Channel> channel, const std::string& id,
              Clock::time_point start, httplib::Response& res, int64_t choices) {
    auto state = std::make_shared<StreamState>();
    state->channel = std::move(channel);
    state->kind = kind;
    state->choices = choices;
    state->n = request.n;
    state->prompt_tokens.assign(static_cast<size_t>(choices), 0);
    state->with_logprobs = request.logprobs.has_value();
    state->token_text = token_text();
    state->id = id;
    state->created = created_now();
    state->model = options.served_model_name;
    state->include_usage = request.include_usage;
    state->start = start;
    const std::string path = kind == Kind::Chat ? "/v1/chat/completions" : "/v1/completions";
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [state](size_t, httplib::DataSink& sink) { return write_events(*state, sink); },
        [this, state, path](bool success) {
          if (!state->complete) {
            loop->abort(state->channel);  // the client went away: free its blocks now
            if (options.log_requests) {
              logger().info(fmt::format("{} stream closed by the client after {} tokens; aborted", path,
                                        state->completion_tokens));
            }
          } else if (options.log_requests && success) {
            logger().info(fmt::format("{} 200 stream prompt={} completion={} finish={} {:.2f}s", path,
                                      state->usage_prompt_tokens(), state->completion_tokens, state->finish_reason,
                                      std::chrono::duration<double>(Clock::now() - state->start).count()));
          }
        });
  }

  // One call of the content provider: whatever outputs are ready, as SSE
  // events. Returns false when the client is gone.
  static bool write_events(StreamState& state, httplib::DataSink& sink) {
    auto write = [&](const json& object) {
      const std::string event = sse_event(object);
      return sink.write(event.data(), event.size());
    };
    if (!state.started) {
      state.started = true;
      for (int64_t i = 0; state.kind == Kind::Chat && i < state.choices; ++i) {
        if (!write(chat_chunk(state.id, state.created, state.model, i, {{"role", "assistant"}, {"content", ""}},
                              std::nullopt))) {
          return false;
        }
      }
    }
    for (ChoiceOutput& out : state.channel->wait(std::chrono::milliseconds(200))) {
      const RequestOutput& o = out.output;
      state.prompt_tokens[static_cast<size_t>(out.index)] = o.prompt_tokens;
      state.completion_tokens += static_cast<int64_t>(o.new_tokens.size());
      // A chunk carries the logprobs of the tokens drawn with it (text held
      // back for a stop string comes later, its logprobs now).
      const bool logprobs = state.with_logprobs && !o.logprobs.empty();
      if (!o.new_text.empty() || logprobs) {
        json lp = nullptr;
        if (logprobs) {
          lp = state.kind == Kind::Chat ? chat_logprobs(o.logprobs, state.token_text)
                                        : completion_logprobs({.logprobs = o.logprobs}, state.token_text);
        }
        const json chunk =
            state.kind == Kind::Chat
                ? chat_chunk(state.id, state.created, state.model, out.index, {{"content", o.new_text}}, std::nullopt, lp)
                : completion_chunk(state.id, state.created, state.model, out.index, o.new_text, std::nullopt, lp);
        if (!write(chunk)) return false;
      }
      if (o.finished) {
        state.finish_reason = finish_reason_name(o.finish_reason);
        const json last =
            state.kind == Kind::Chat
                ? chat_chunk(state.id, state.created, state.model, out.index, json::object(), state.finish_reason)
                : completion_chunk(state.id, state.created, state.model, out.index, "", state.finish_reason);
        if (!write(last)) return false;
      }
    }
    if (state.channel->closed()) {
      state.complete = true;
      if (auto error = state.channel->error()) {
        std::string message = *error;
        if (message != kShuttingDown) {
          message = "the server could not complete the request (see its log)";
          logger().error(fmt::format("stream {} failed: {}", state.id, *error));
        }
        write({{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
      }
      if (state.include_usage) {
        json usage = {{"id", state.id},
                      {"object", state.kind == Kind::Chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", state.created},
                      {"model", state.model},
                      {"choices", json::array()},
                      {"usage", usage_json(state.usage_prompt_tokens(), state.completion_tokens)}};
        if (!write(usage)) return false;
      }
      static const std::string done = "data: [DONE]\n\n";
      if (!sink.write(done.data(), done.size())) return false;
      sink.done();
    }
    return true;
  }

  std::string metrics() {
    const LoopStats stats = loop->stats();
    HttpCounts counts;
    {
      std::lock_guard lock(mutex);
      counts = http_counts;
    }
    return render_metrics(stats, counts, options.served_model_name, tensor_parallel_size);
  }
};

namespace {

// Each connection holds a file descriptor; the model, the engine and the
// process keep some more (kReservedFds).
constexpr int kReservedFds = 128;

int connection_limit(int requested, int threads) {
  rlimit limit{};
  const int64_t fds = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                          ? static_cast<int64_t>(limit.rlim_cur)
                          : int64_t{1} << 20;
  const int64_t available = std::max<int64_t>(1, fds - kReservedFds);
  if (requested == 0) return static_cast<int>(std::min<int64_t>(4 * int64_t{threads}, available));
  if (requested < 0 || requested > 1'000'000) {
    throw ConfigError(fmt::format("max_connections = {}: must be between 1 and 1000000 (0 = 4 x threads)", requested));
  }
  if (requested > available) {
    throw ConfigError(fmt::format("max_connections = {}: this process may open {} files (ulimit -n), {} of them "
                                  "kept for the server itself; lower --max_connections or raise ulimit -n",
                                  requested, fds, kReservedFds));
  }
  return requested;
}

std::chrono::milliseconds request_timeout(double seconds) {
  if (!(seconds >= 0.1 && seconds <= 3600)) {
    throw ConfigError(fmt::format("request_timeout = {} s: must be between 0.1 and 3600", seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

Server::Server(std::unique_ptr<InferenceEngine> engine, ChatPrompt chat, ServerOptions options,
               cluster::ProcessGroupPtr tp_group)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = std::move(options);
  s.chat = std::move(chat);
  const InferenceConfig& config = engine->config();
  s.limits = {.max_input_len = config.max_input_len, .max_output_len = config.max_output_len, .max_context = s.options.max_context};
  s.defaults = config.default_sampling();
  const int threads = s.options.threads > 0 ? s.options.threads
                                            : static_cast<int>(std::max<int64_t>(16, 2 * config.max_batch_size));
  s.tensor_parallel_size = config.tp_size;
  std::unique_ptr<StepBroadcast> tp_steps;
  if (config.tp_size > 1) {
    if (!tp_group || tp_group->size() != config.tp_size || tp_group->rank() != 0) {
      throw ConfigError(fmt::format("a server over a tensor-parallel engine (tp_size {}) runs on rank 0 of its group; "
                                    "it was given {}",
                                    config.tp_size,
                                    tp_group ? fmt::format("rank {} of a group of {}", tp_group->rank(), tp_group->size())
                                             : std::string("no process group")));
    }
    tp_steps = std::make_unique<StepBroadcast>(std::move(tp_group));
  }
  s.loop = std::make_unique<EngineLoop>(std::move(engine), std::move(tp_steps), [this] { stop(); });

  const ConnectionLimits limits{.threads = threads,
                                .max_connections = connection_limit(s.options.max_connections, threads),
                                .request_timeout = request_timeout(s.options.request_timeout_s)};
  // Called by listen(), after bind() has set port_.
  s.http.new_task_queue = [this, limits] { return new ConnectionPool(limits, port_); };
  s.http.set_logger([](const httplib::Request&, const httplib::Response&) { ConnectionPool::response_written(); });
  s.http.set_keep_alive_timeout(2);
  // A client that stops sending or reading holds a worker thread no longer than this.
  s.http.set_read_timeout(5, 0);
  s.http.set_write_timeout(5, 0);
  s.http.set_payload_max_length(size_t{64} << 20);
  s.route("POST", "/v1/completions", [&s](const auto& req, auto& res) { s.completions(req, res); });
  s.route("POST", "/v1/chat/completions", [&s](const auto& req, auto& res) { s.chat_completions(req, res); });
  s.route("GET", "/v1/models", [&s](const auto&, auto& res) {
    const json body = {{"object", "list"},
                       {"data",
                        json::array({{{"id", s.options.served_model_name},
                                      {"object", "model"},
                                      {"created", s.created},
                                      {"owned_by", "colossus"},
                                      {"max_model_len", s.options.max_context}}})}};
    res.set_content(dump_json(body), "application/json");
  });
  // vLLM's /tokenize and /detokenize: {"prompt"} or {"messages"} -> token ids; ids -> text.
  s.route("POST", "/tokenize", [&s](const auto& req, auto& res) { s.tokenize(req, res); });
  s.route("POST", "/detokenize", [&s](const auto& req, auto& res) { s.detokenize(req, res); });
  s.route("GET", "/health", [&s](const auto&, auto& res) {
    res.set_content(dump_json({{"status", "ok"}, {"tensor_parallel_size", s.tensor_parallel_size}}), "application/json");
  });
  s.route("GET", "/metrics", [&s](const auto&, auto& res) { res.set_content(s.metrics(), "text/plain; version=0.0.4"); });
  // Unrouted paths and methods get an OpenAI-style body too (ours already carry one).
  s.http.set_error_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    s.count("other", res.status);
    send_error(res, ApiError(res.status, fmt::format("no route for {} {}", req.method, req.path), {},
                             "invalid_request_error", res.status == 404 ? std::optional<std::string>("not_found") : std::nullopt));
  });
}

Server::~Server() {
  stop();
  impl_->loop->stop();
}

namespace {

// httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into
// Debian's library), so a burst of new connections (64 clients at once) got
// resets. listen() may be called again on a listening socket to change its
// backlog: find ours by its port and raise it to the system's maximum.
void raise_listen_backlog(int port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    int bound_port = -1;
    if (address.ss_family == AF_INET) bound_port = ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
    if (address.ss_family == AF_INET6) bound_port = ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
    int listening = 0;
    socklen_t size = sizeof(listening);
    if (bound_port == port && ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening) {
      ::listen(fd, SOMAXCONN);
    }
  }
}

}  // namespace

int Server::bind() {
  Impl& s = *impl_;
  const int port = s.options.port == 0 ? s.http.bind_to_any_port(s.options.host) : s.options.port;
  if (s.options.port != 0 && !s.http.bind_to_port(s.options.host, s.options.port)) {
    throw ConfigError(fmt::format("cannot listen on {}:{} (in use, or not an address of this machine); pick "
                                  "another --port or --host",
                                  s.options.host, s.options.port));
  }
  if (port < 0) throw ConfigError(fmt::format("cannot listen on {} (not an address of this machine?)", s.options.host));
  raise_listen_backlog(port);
  port_ = port;
  return port;
}

void Server::listen() {
  impl_->http.listen_after_bind();
  impl_->loop->stop();
}

std::optional<std::string> Server::failure() const { return impl_->loop->failure(); }

void Server::stop() {
  // httplib's stop() may run once per listen: is_running() stays true while
  // in-flight requests drain, and a second stop() then asserts.
  if (impl_->http.is_running() && !impl_->stop_sent.exchange(true)) impl_->http.stop();
}

}  // namespace colossus::inference::serving
