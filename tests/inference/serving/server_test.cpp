// `colossus serve` end to end: the real binary on a loopback port with a tiny
// GPT-2 saved as a Hugging Face directory (byte tokenizer, a chat template),
// exercised with curl, httplib's client (concurrent load, a client that hangs
// up mid-stream) and the `openai` Python package. Every generated text is
// checked against full-recompute greedy decoding of the same weights.
#include "colossus/data/corpus.h"
#include "colossus/data/tokenizer.h"
#include "colossus/inference/generate.h"
#include "colossus/data/chat/chat_template.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/serving/server_process.h"
#include "tests/inference/support.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace colossus::inference {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::ServerProcess;

constexpr int64_t kMaxInputLen = 64;
constexpr int64_t kMaxOutputLen = 400;
constexpr const char* kTemplate =
    "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('tool messages come after a call') }}{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

struct HttpResult {
  int status = 0;
  std::string body;
  json parsed() const { return json::parse(body); }
};

// POST/GET through curl; body files are unique so threads may call it.
HttpResult curl(const std::string& url, const std::optional<std::string>& body = std::nullopt) {
  static std::atomic<int> counter{0};
  const int n = counter++;
  const fs::path out = testing::scratch_dir() / fmt::format("curl_out_{}", n);
  std::string command = fmt::format("curl -s -S -o '{}' -w '%{{http_code}}' ", out.string());
  if (body) {
    const fs::path in = testing::scratch_dir() / fmt::format("curl_in_{}", n);
    std::ofstream(in) << *body;
    command += fmt::format("-H 'Content-Type: application/json' --data-binary '@{}' ", in.string());
  }
  const auto result = testing::run_command(command + "'" + url + "'");
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  return {std::atoi(result.output.c_str()), text.str()};
}

// The data: events of an SSE body, in order ("[DONE]" included as a string).
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> events;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("data: ", 0) == 0) events.push_back(line.substr(6));
  }
  return events;
}

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(testing::scratch_dir() / "tiny");
    model_ = new std::shared_ptr<models::CausalLM>(testing::tiny_gpt2(/*vocab=*/257, /*n_positions=*/512));
    models::save_pretrained(**model_, dir_->string());
    data::save_byte_tokenizer(dir_->string());
    std::ofstream(*dir_ / "chat_template.jinja") << kTemplate;
    tokenizer_ = data::load_tokenizer(dir_->string()).release();
    server_ = new ServerProcess(dir_->string(),
                                {"--served_model_name", "tiny", "--max_batch_size", "4", "--max_input_len",
                                 std::to_string(kMaxInputLen), "--max_output_len", std::to_string(kMaxOutputLen),
                                 "--block_size", "8", "--threads", "24"},
                                testing::scratch_dir() / "serve.log");
  }
  static void TearDownTestSuite() {
    delete server_;
    delete tokenizer_;
    delete model_;
    delete dir_;
  }

  // The name logprobs give a token of the byte tokenizer: its character, or
  // "bytes:\xNN" for a byte that is not a whole UTF-8 character.
  static std::string token_name(int64_t id) {
    if (id >= 0x80 && id < 0x100) return fmt::format("bytes:\\x{:02x}", id);  // the byte tokenizer: id = byte
    return tokenizer_->decode({static_cast<int32_t>(id)});
  }
  static std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) {
    const auto ids = tokenizer_->encode(text, add_special_tokens);
    return {ids.begin(), ids.end()};
  }
  // Full-recompute greedy decoding (stopping at eos), as text; `completion_tokens` gets the count.
  static std::string greedy(const std::vector<int64_t>& ids, int64_t max_new, int64_t* completion_tokens = nullptr) {
    GenerateOptions options{.max_new_tokens = max_new, .sampling = {.do_sample = false}, .eos_id = tokenizer_->eos_id()};
    const auto all = generate(**model_, ids, options);
    const std::vector<int32_t> generated(all.begin() + static_cast<int64_t>(ids.size()), all.end());
    if (completion_tokens) *completion_tokens = static_cast<int64_t>(generated.size());
    return tokenizer_->decode(generated, /*skip_special_tokens=*/true);
  }
  static std::vector<int64_t> chat_ids(const nlohmann::ordered_json& messages) {
    const data::chat::ChatTemplate chat(kTemplate);
    return encode(chat.apply(messages, /*add_generation_prompt=*/true), /*add_special_tokens=*/false);
  }
  static HttpResult post(const std::string& path, const json& body) { return curl(server_->url() + path, body.dump()); }

  static std::map<std::string, double> metrics() {
    const HttpResult res = curl(server_->url() + "/metrics");
    EXPECT_EQ(res.status, 200);
    std::map<std::string, double> values;
    const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$)");
    std::istringstream lines(res.body);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::smatch match;
      EXPECT_TRUE(std::regex_match(line, match, sample)) << "not a Prometheus sample line: " << line;
      if (!match.empty()) values[match[1].str() + match[2].str()] = std::stod(match[3]);
    }
    return values;
  }
  static double metric(const std::map<std::string, double>& values, const std::string& name,
                       const std::string& labels = "{model=\"tiny\"}") {
    auto it = values.find(name + labels);
    EXPECT_NE(it, values.end()) << name << labels << " missing from /metrics";
    return it == values.end() ? -1 : it->second;
  }
  // Polls /metrics until nothing is queued, running or holding KV blocks.
  static bool wait_idle(double timeout_s = 15) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < timeout_s) {
      const auto m = metrics();
      if (metric(m, "colossus:requests_running") == 0 && metric(m, "colossus:requests_waiting") == 0 &&
          metric(m, "colossus:kv_blocks_used") == 0) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  static fs::path* dir_;
  static std::shared_ptr<models::CausalLM>* model_;
  static data::Tokenizer* tokenizer_;
  static ServerProcess* server_;
};

fs::path* Serve::dir_ = nullptr;
std::shared_ptr<models::CausalLM>* Serve::model_ = nullptr;
data::Tokenizer* Serve::tokenizer_ = nullptr;
ServerProcess* Serve::server_ = nullptr;

TEST_F(Serve, CompletionsEqualFullRecomputeGreedyWithUsage) {
  int64_t completion_tokens = 0;
  const std::string expected = greedy(encode("Hello"), 20, &completion_tokens);
  const HttpResult res = post("/v1/completions", {{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 20}, {"temperature", 0}});
  ASSERT_EQ(res.status, 200) << res.body;
  const json body = res.parsed();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["text"], expected);
  EXPECT_EQ(body["choices"][0]["finish_reason"], completion_tokens == 20 ? "length" : "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], encode("Hello").size());
  EXPECT_EQ(body["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(body["usage"]["total_tokens"], completion_tokens + static_cast<int64_t>(encode("Hello").size()));

  // Token ids, and a list of prompts (one choice each, in order).
  const std::vector<int64_t> ids{72, 105, 33, 32, 87};
  const HttpResult by_ids = post("/v1/completions", {{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 9}, {"temperature", 0}});
  ASSERT_EQ(by_ids.status, 200) << by_ids.body;
  EXPECT_EQ(by_ids.parsed()["choices"][0]["text"], greedy(ids, 9));
  const HttpResult list = post("/v1/completions", {{"model", "tiny"}, {"prompt", {"The cat", "A much longer prompt here"}},
                                                   {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(list.status, 200) << list.body;
  ASSERT_EQ(list.parsed()["choices"].size(), 2u);
  EXPECT_EQ(list.parsed()["choices"][0]["index"], 0);
  EXPECT_EQ(list.parsed()["choices"][0]["text"], greedy(encode("The cat"), 12));
  EXPECT_EQ(list.parsed()["choices"][1]["text"], greedy(encode("A much longer prompt here"), 12));
}

TEST_F(Serve, StreamingSseChunksConcatenateToTheGreedyText) {
  const std::string expected = greedy(encode("Stream me"), 30);
  const HttpResult res = post("/v1/completions", {{"model", "tiny"}, {"prompt", "Stream me"}, {"max_tokens", 30},
                                                  {"temperature", 0}, {"stream", true}});
  ASSERT_EQ(res.status, 200) << res.body;
  const auto events = sse_data(res.body);
  ASSERT_GE(events.size(), 3u) << res.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  int finishes = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(i + 2, events.size()) << "finish_reason before the last chunk";
    }
  }
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(text, expected);
  EXPECT_GE(events.size(), 4u) << "the text should arrive in several chunks";

  // Chat: role first, then content, a final empty delta with finish_reason, usage, [DONE].
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hi there"}}};
  const std::string chat_expected = greedy(chat_ids(messages), 25);
  const HttpResult chat = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", json::parse(messages.dump())},
                                                        {"max_tokens", 25}, {"temperature", 0}, {"stream", true},
                                                        {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const auto chat_events = sse_data(chat.body);
  ASSERT_GE(chat_events.size(), 4u);
  EXPECT_EQ(chat_events.back(), "[DONE]");
  const json first = json::parse(chat_events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json usage = json::parse(chat_events[chat_events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], chat_ids(messages).size());
  const json last = json::parse(chat_events[chat_events.size() - 3]);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_FALSE(last["choices"][0]["finish_reason"].is_null());
  std::string content;
  for (size_t i = 1; i + 3 < chat_events.size(); ++i) {
    const json chunk = json::parse(chat_events[i]);
    EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    content += chunk["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(content, chat_expected);
}

TEST_F(Serve, ChatCompletionsGoThroughTheModelsTemplate) {
  const nlohmann::ordered_json messages = {{{"role", "system"}, {"content", "Be brief."}},
                                           {{"role", "user"}, {"content", "What is 2+2?"}}};
  int64_t completion_tokens = 0;
  const std::string expected = greedy(chat_ids(messages), 16, &completion_tokens);
  const HttpResult res = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", json::parse(messages.dump())},
                                                       {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(res.status, 200) << res.body;
  const json body = res.parsed();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], expected);
  EXPECT_EQ(body["usage"]["prompt_tokens"], chat_ids(messages).size());
  EXPECT_EQ(body["usage"]["completion_tokens"], completion_tokens);

  // The template's raise_exception is the client's error.
  const HttpResult raised = post("/v1/chat/completions",
                                 {{"model", "tiny"}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}, {"max_tokens", 4}});
  EXPECT_EQ(raised.status, 400) << raised.body;
  EXPECT_NE(raised.body.find("tool messages come after a call"), std::string::npos) << raised.body;
}

TEST_F(Serve, StopStringsCutTheText) {
  // A stop string taken from the greedy text itself: the reply ends before its first occurrence.
  for (const std::string prompt : {"Stop here", "Another one", "Third try", "xyz"}) {
    const std::string full = greedy(encode(prompt), 40);
    std::string stop;
    for (size_t i = 3; i < full.size() && stop.empty(); ++i) {
      if (std::isalnum(static_cast<unsigned char>(full[i]))) stop = full.substr(i, 1);
    }
    if (stop.empty()) continue;
    const HttpResult res = post("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 40},
                                                    {"temperature", 0}, {"stop", {stop, "never-there"}}});
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_EQ(res.parsed()["choices"][0]["text"], full.substr(0, full.find(stop))) << "stop " << stop;
    EXPECT_EQ(res.parsed()["choices"][0]["finish_reason"], "stop");
    return;
  }
  GTEST_SKIP() << "no greedy text with an ASCII letter to stop at";
}

TEST_F(Serve, BadRequestsGetOpenAiJsonErrorsNamingTheProblem) {
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string param;  // "" = null
    std::string says;
  };
  const std::string long_prompt(kMaxInputLen + 10, 'a');
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"model\": \"tiny\", \"prompt\": ", 400, "", "not valid JSON"},
      {"/v1/completions", "[1, 2]", 400, "", "JSON object"},
      {"/v1/completions", R"({"model": "tiny"})", 400, "prompt", "'prompt' is required"},
      {"/v1/completions", R"({"prompt": "x"})", 400, "model", "'model' is required"},
      {"/v1/completions", R"({"model": "gpt-9", "prompt": "x"})", 404, "model", "'gpt-9' does not exist"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": -5})", 400, "max_tokens", "at least 1"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 0})", 400, "max_tokens", "at least 1"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 100000})", 400, "max_tokens", "max_output_len"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": "many"})", 400, "max_tokens", "an integer"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "temperature": "hot"})", 400, "temperature", "a number"},
      {"/v1/completions", R"({"model": "tiny", "prompt": 42})", 400, "prompt", "a string"},
      {"/v1/completions", R"({"model": "tiny", "prompt": [1, 99999]})", 400, "", "outside the vocabulary"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "n": 0})", 400, "n", "n = 0 is outside [1, 64]"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "logprobs": 21})", 400, "logprobs", "logprobs = 21 is outside [0, 20]"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs", "needs logprobs = true"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "presence_penalty": 3})", 400, "", "presence_penalty = 3 is outside [-2, 2]"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "stop": 5})", 400, "stop", "a string or a list"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "top_p": 0})", 400, "", "top_p"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": -1})", 400, "max_tokens", "at least 1"},
      {"/v1/completions", fmt::format(R"({{"model": "tiny", "prompt": "{}"}})", long_prompt), 400, "prompt", "max_input_len"},
      {"/v1/chat/completions", R"({"model": "tiny"})", 400, "messages", "'messages' is required"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": []})", 400, "messages", "empty"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": [{"content": "x"}]})", 400, "messages", "'role'"},
      {"/v1/nothing", "{}", 404, "", "no route"},
  };
  for (const Case& c : cases) {
    const HttpResult res = curl(server_->url() + c.path, c.body);
    EXPECT_EQ(res.status, c.status) << c.body << " -> " << res.body;
    json body;
    ASSERT_NO_THROW(body = res.parsed()) << res.body;
    ASSERT_TRUE(body.contains("error")) << res.body;
    const json& error = body["error"];
    EXPECT_NE(error["message"].get<std::string>().find(c.says), std::string::npos) << c.body << " -> " << res.body;
    EXPECT_TRUE(error["type"].is_string()) << res.body;
    EXPECT_TRUE(error.contains("code")) << res.body;
    if (c.param.empty()) EXPECT_TRUE(error["param"].is_null()) << res.body;
    else EXPECT_EQ(error["param"], c.param) << res.body;
  }
  const HttpResult too_long = curl(server_->url() + "/v1/completions", cases[19].body);
  EXPECT_EQ(too_long.parsed()["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(curl(server_->url() + "/v1/completions", cases[4].body).parsed()["error"]["code"], "model_not_found");
}

// log_softmax over the vocabulary after ids, from transformers on the saved weights.
struct HfLogprobs {
  std::vector<double> logprobs;
  std::vector<std::vector<std::pair<int64_t, double>>> top;
};
HfLogprobs hf_logprobs(const fs::path& dir, const std::vector<int64_t>& ids, int64_t top) {
  const auto result = testing::run_oracle(fmt::format("logprobs '{}' --ids {} --top {}", dir.string(), fmt::join(ids, ","), top));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const auto start = result.output.rfind("{\"logprobs\"");
  if (start == std::string::npos) return {};
  const json j = json::parse(result.output.substr(start));
  return {j["logprobs"].get<std::vector<double>>(), j["top"].get<std::vector<std::vector<std::pair<int64_t, double>>>>()};
}

TEST_F(Serve, EchoAndLogprobsEqualTransformersLogSoftmax) {
  // lm-evaluation-harness's loglikelihood request: the prompt echoed with
  // its tokens' logprobs, then the completion's.
  const std::string prompt = "The cat sat";
  const auto ids = encode(prompt);
  const HttpResult res = post("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 5},
                                                  {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 2},
                                                  {"echo", true}});
  ASSERT_EQ(res.status, 200) << res.body;
  const json choice = res.parsed()["choices"][0];
  const auto all = generate(**model_, ids, {.max_new_tokens = 5, .sampling = {.do_sample = false}});
  ASSERT_EQ(all.size(), ids.size() + 5);
  EXPECT_EQ(choice["text"], prompt + tokenizer_->decode(std::vector<int32_t>(all.begin() + static_cast<int64_t>(ids.size()), all.end())));
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), all.size()) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"][0], 0);
  const HfLogprobs hf = hf_logprobs(*dir_, all, 2);
  ASSERT_EQ(hf.logprobs.size(), all.size() - 1);
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), hf.logprobs[i - 1], 1e-4) << "position " << i;
    EXPECT_EQ(lp["tokens"][i], token_name(all[i])) << "position " << i;
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 2u) << top.dump();
    for (const auto& [id, logprob] : hf.top[i - 1]) {
      const std::string key = token_name(id);
      ASSERT_TRUE(top.contains(key)) << "position " << i << ": " << top.dump();
      EXPECT_NEAR(top[key].get<double>(), logprob, 1e-4) << "position " << i;
    }
  }
  // Chat: logprobs = true with top_logprobs; greedy draws each position's most likely token.
  const HttpResult chat = post("/v1/chat/completions",
                               {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", true},
                                {"top_logprobs", 3}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json content = chat.parsed()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << chat.body;
  for (const json& token : content) {
    ASSERT_EQ(token["top_logprobs"].size(), 3u);
    EXPECT_EQ(token["token"], token["top_logprobs"][0]["token"]);
    EXPECT_NEAR(token["logprob"].get<double>(), token["top_logprobs"][0]["logprob"].get<double>(), 1e-9);
    EXPECT_LE(token["logprob"].get<double>(), 0.0);
    EXPECT_EQ(token["bytes"].size(), token["token"].get<std::string>().size());
  }
}

TEST_F(Serve, NChoicesAndPresenceFrequencyPenalties) {
  // n = 3 sampled choices: seeded (the same request gives the same choices),
  // not all alike, the prompt counted once in usage.
  const json request = {{"model", "tiny"}, {"prompt", "Once upon"}, {"max_tokens", 8}, {"temperature", 2.0},
                        {"seed", 11}, {"n", 3}, {"ignore_eos", true}};
  const HttpResult first = post("/v1/completions", request), again = post("/v1/completions", request);
  ASSERT_EQ(first.status, 200) << first.body;
  const json choices = first.parsed()["choices"];
  ASSERT_EQ(choices.size(), 3u);
  std::set<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(choices[i]["index"], i);
    texts.insert(choices[i]["text"].get<std::string>());
  }
  EXPECT_GT(texts.size(), 1u) << "three samples at temperature 2 should not all agree: " << choices.dump();
  EXPECT_EQ(again.parsed()["choices"], choices);
  const json usage = first.parsed()["usage"];
  EXPECT_EQ(usage["prompt_tokens"], encode("Once upon").size());
  EXPECT_EQ(usage["completion_tokens"], 24);
  // Chat with n = 2: two choices of one prompt.
  const HttpResult chat = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                        {"max_tokens", 3}, {"n", 2}, {"seed", 1}, {"ignore_eos", true}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.parsed()["choices"].size(), 2u);
  EXPECT_EQ(chat.parsed()["choices"][1]["index"], 1);
  // Streamed, two prompts of different lengths with n = 2: usage counts each
  // prompt once and every choice's tokens, as the same request unstreamed.
  json listed = {{"model", "tiny"}, {"prompt", {"ab", "abcdefg"}}, {"max_tokens", 3}, {"n", 2}, {"seed", 5},
                 {"temperature", 1.0}, {"ignore_eos", true}};
  const HttpResult unstreamed = post("/v1/completions", listed);
  ASSERT_EQ(unstreamed.status, 200) << unstreamed.body;
  EXPECT_EQ(unstreamed.parsed()["usage"]["prompt_tokens"], encode("ab").size() + encode("abcdefg").size());
  listed["stream"] = true;
  listed["stream_options"] = {{"include_usage", true}};
  const HttpResult streamed = post("/v1/completions", listed);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const auto events = sse_data(streamed.body);
  ASSERT_GE(events.size(), 2u) << streamed.body;
  const json streamed_usage = json::parse(events[events.size() - 2])["usage"];
  EXPECT_EQ(streamed_usage, unstreamed.parsed()["usage"]) << streamed.body;

  // Penalties against step-by-step greedy with the same penalties applied to
  // the generated tokens' counts.
  const double presence = 0.5, frequency = 1.5;
  const auto ids = encode("aaaa");
  std::vector<int64_t> all = ids;
  std::map<int64_t, int64_t> counts;
  {
    at::NoGradGuard no_grad;
    for (int step = 0; step < 10; ++step) {
      at::Tensor logits = (*model_)->forward(at::tensor(all, at::kLong).unsqueeze(0))[0][-1].to(at::kFloat).clone();
      for (const auto& [token, count] : counts) logits[token] -= frequency * static_cast<double>(count) + presence;
      const int64_t next = logits.argmax().item<int64_t>();
      all.push_back(next);
      ++counts[next];
    }
  }
  const std::vector<int32_t> expected(all.begin() + static_cast<int64_t>(ids.size()), all.end());
  const HttpResult penalized = post("/v1/completions", {{"model", "tiny"}, {"prompt", "aaaa"}, {"max_tokens", 10},
                                                        {"temperature", 0}, {"ignore_eos", true},
                                                        {"presence_penalty", presence}, {"frequency_penalty", frequency}});
  ASSERT_EQ(penalized.status, 200) << penalized.body;
  EXPECT_EQ(penalized.parsed()["choices"][0]["text"], tokenizer_->decode(expected));
  const HttpResult plain = post("/v1/completions", {{"model", "tiny"}, {"prompt", "aaaa"}, {"max_tokens", 10},
                                                    {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_NE(plain.parsed()["choices"][0]["text"], penalized.parsed()["choices"][0]["text"])
      << "the penalties should change this greedy text";
}

TEST_F(Serve, TokenizeAndDetokenizeAsVllm) {
  const HttpResult tokens = post("/tokenize", {{"model", "tiny"}, {"prompt", "héllo"}});
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  EXPECT_EQ(tokens.parsed()["tokens"], encode("héllo"));
  EXPECT_EQ(tokens.parsed()["count"], encode("héllo").size());
  const HttpResult chat = post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.parsed()["tokens"], chat_ids({{{"role", "user"}, {"content", "hi"}}}));
  const HttpResult text = post("/detokenize", {{"model", "tiny"}, {"tokens", encode("héllo", false)}});
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_EQ(text.parsed()["prompt"], "héllo");
  EXPECT_EQ(post("/detokenize", {{"tokens", {1, 99999}}}).status, 400);
  EXPECT_EQ(post("/tokenize", {{"model", "gpt-9"}, {"prompt", "x"}}).status, 404);
}

TEST_F(Serve, TheServingBenchmarkClientRunsItsMixAndChecksEveryResponse) {
  // bench/serve_bench.py's flow on a small mix (token ids inside the tiny
  // vocabulary), through the openai package and through the standard-library
  // client (the GPU image has no openai): the same requests, the same counts.
  for (const char* client : {"openai", "stdlib"}) {
    const fs::path summary = testing::scratch_dir() / fmt::format("serve_bench_{}.json", client);
    const auto result = testing::run_command(fmt::format(
        "'{}' '{}' --base-url '{}/v1' --model tiny --num-requests 6 --request-rate 50 --seed 3 --max-input 20 "
        "--max-output 12 --token-low 32 --token-high 120 --client {} --json '{}' 2>&1",
        COLOSSUS_PYTHON, COLOSSUS_SERVE_BENCH, server_->url(), client, summary.string()));
    ASSERT_EQ(result.exit_code, 0) << client << ": " << result.output;
    EXPECT_NE(result.output.find("Serving Benchmark Result"), std::string::npos) << result.output;
    std::ifstream in(summary);
    const json s = json::parse(in);
    EXPECT_EQ(s["successful_requests"], 6) << client;
    EXPECT_EQ(s["failed_requests"], 0) << client;
    EXPECT_GT(s["total_generated_tokens"].get<int64_t>(), 6 * 3) << client;
    EXPECT_GT(s["output_tokens_per_s"].get<double>(), 0) << client;
    EXPECT_LE(s["ttft_ms"]["median"].get<double>(), s["e2e_ms"]["p99"].get<double>()) << client;
  }

  // The engine benchmark's own requests (shared system prompts included),
  // written by bench_inference --write-mix and replayed over HTTP: the same
  // token counts come back.
  const fs::path mix = testing::scratch_dir() / "engine_mix.json";
  const auto wrote = testing::run_command(fmt::format(
      "'{}' --write-mix '{}' --vocab 257 --mix-requests 5 --mix-system-prompts 2 --mix-system-len 8 "
      "--mix-max-input 20 --mix-max-output 12 2>&1",
      COLOSSUS_BENCH_INFERENCE, mix.string()));
  ASSERT_EQ(wrote.exit_code, 0) << wrote.output;
  json written;
  std::ifstream(mix) >> written;
  ASSERT_EQ(written["requests"].size(), 5u) << written.dump();
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::set<std::vector<int64_t>> openings;  // the 8-token system prompts
  for (const json& r : written["requests"]) {
    const auto prompt = r["prompt"].get<std::vector<int64_t>>();
    ASSERT_GE(prompt.size(), 12u);
    for (int64_t id : prompt) ASSERT_TRUE(id >= 0 && id < 257) << id;
    openings.insert({prompt.begin(), prompt.begin() + 8});
    prompt_tokens += static_cast<int64_t>(prompt.size());
    output_tokens += r["max_tokens"].get<int64_t>();
  }
  EXPECT_LE(openings.size(), 2u);
  const fs::path summary = testing::scratch_dir() / "serve_bench_mix.json";
  const auto replayed = testing::run_command(
      fmt::format("'{}' '{}' --base-url '{}/v1' --model tiny --mix '{}' --request-rate inf --client stdlib --json '{}' 2>&1",
                  COLOSSUS_PYTHON, COLOSSUS_SERVE_BENCH, server_->url(), mix.string(), summary.string()));
  ASSERT_EQ(replayed.exit_code, 0) << replayed.output;
  std::ifstream in(summary);
  const json s = json::parse(in);
  EXPECT_EQ(s["successful_requests"], 5);
  EXPECT_EQ(s["total_input_tokens"], prompt_tokens);
  EXPECT_EQ(s["total_generated_tokens"], output_tokens);
}

TEST_F(Serve, VllmStyleDefaultsOnACpuMachine) {
  // The fixture passes no --device, --dtype or --use_cuda_graph: auto picks
  // the CPU (no GPU here), fp32 on it, no CUDA graphs; the context is the model's.
  const std::string log = server_->log();
  EXPECT_NE(log.find("(gpt2, fp32, cpu) in"), std::string::npos) << log;
  const HttpResult models = curl(server_->url() + "/v1/models");
  EXPECT_EQ(models.parsed()["data"][0]["max_model_len"], 512) << models.body;
  // Asking for CUDA graphs on the CPU is refused by name before loading.
  try {
    ServerProcess refused(dir_->string(), {"--use_cuda_graph", "true"}, testing::scratch_dir() / "serve_graph.log", 30);
    ADD_FAILURE() << "a server with --use_cuda_graph true started on the CPU";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--use_cuda_graph true needs a GPU"), std::string::npos) << e.what();
  }
}

TEST_F(Serve, LengthsDefaultToTheModelsContextAsVllm) {
  // No length flags: a request may span the model's 512 positions, prompt and
  // output together, as vLLM's max_model_len; the CPU keeps a batch of 8.
  ServerProcess whole(dir_->string(), {"--served_model_name", "tiny", "--quiet"},
                      testing::scratch_dir() / "serve_lengths.log");
  EXPECT_NE(whole.log().find("max_model_len 512, max_batch_size 8, max_input_len 511, max_output_len 511, "
                             "max_num_batched_tokens 511"),
            std::string::npos)
      << whole.log();
  EXPECT_EQ(curl(whole.url() + "/v1/models").parsed()["data"][0]["max_model_len"], 512);
  const HttpResult long_request = curl(whole.url() + "/v1/completions",
                                       json{{"model", "tiny"}, {"prompt", std::string(400, 'a')}, {"max_tokens", 100},
                                            {"temperature", 0}, {"ignore_eos", true}}
                                           .dump());
  ASSERT_EQ(long_request.status, 200) << long_request.body;
  EXPECT_EQ(long_request.parsed()["usage"]["completion_tokens"], 100);
  // Unset max_tokens: what fits after the prompt (BOS + 500 bytes -> 11 of 512).
  const HttpResult fill = curl(whole.url() + "/v1/completions",
                               json{{"model", "tiny"}, {"prompt", std::string(500, 'b')}, {"temperature", 0},
                                    {"ignore_eos", true}}
                                   .dump());
  ASSERT_EQ(fill.status, 200) << fill.body;
  EXPECT_EQ(fill.parsed()["usage"]["prompt_tokens"].get<int64_t>() + fill.parsed()["usage"]["completion_tokens"].get<int64_t>(), 512);
  EXPECT_EQ(whole.stop(SIGTERM), 0) << whole.log();

  // --max_model_len narrows it; prompts past it are refused by name.
  ServerProcess narrow(dir_->string(), {"--served_model_name", "tiny", "--quiet", "--max_model_len", "128"},
                       testing::scratch_dir() / "serve_max_model_len.log");
  EXPECT_EQ(curl(narrow.url() + "/v1/models").parsed()["data"][0]["max_model_len"], 128);
  const HttpResult too_long = curl(narrow.url() + "/v1/completions",
                                   json{{"model", "tiny"}, {"prompt", std::string(200, 'a')}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  EXPECT_NE(too_long.body.find("max_input_len"), std::string::npos) << too_long.body;

  // More than the model holds, or a prompt bound that leaves nothing to generate, is refused before loading.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused_cases = {
      {{"--max_model_len", "1024"}, "--max_model_len 1024 is not in [2, 512] (the model's context)"},
      {{"--max_model_len", "64", "--max_input_len", "64"}, "--max_input_len 64 leaves no room to generate within max_model_len 64"}};
  for (const auto& [args, expected] : refused_cases) {
    try {
      ServerProcess refused(dir_->string(), args, testing::scratch_dir() / "serve_lengths_refused.log", 30);
      ADD_FAILURE() << "a server started with " << fmt::format("{}", fmt::join(args, " "));
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  // Loopback unless told otherwise.
  const auto help = testing::run_command(fmt::format("'{}' serve --help 2>&1", COLOSSUS_BIN));
  EXPECT_TRUE(std::regex_search(help.output, std::regex(R"(--host TEXT=127\.0\.0\.1\s)"))) << help.output;
}

TEST_F(Serve, GpuMemoryUtilizationIsCheckedBeforeLoadingAndIgnoredOnTheCpu) {
  // vLLM's --gpu_memory_utilization: a share of the GPU's memory in (0, 1],
  // refused by value before the model loads; with --kv_cache_memory_fraction
  // as well it is ambiguous, so that is refused too.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused_cases = {
      {{"--gpu_memory_utilization", "1.5"}, "gpu_memory_utilization is 1.5; it must be in (0, 1]"},
      {{"--gpu-memory-utilization", "0"}, "gpu_memory_utilization is 0; it must be in (0, 1]"},
      {{"--gpu_memory_utilization", "0.8", "--kv_cache_memory_fraction", "0.5"}, "both size the KV cache"}};
  for (const auto& [args, expected] : refused_cases) {
    try {
      ServerProcess refused(dir_->string(), args, testing::scratch_dir() / "serve_utilization.log", 30);
      ADD_FAILURE() << "a server started with " << fmt::format("{}", fmt::join(args, " "));
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  // On the CPU it sizes nothing: a tiny share gives the fixture's pool
  // (same lengths and block size), whose default is 0.9.
  const std::regex pool("KV cache ([0-9]+) blocks of 8 tokens;");
  std::smatch ours, fixture;
  const std::string fixture_log = server_->log();
  ASSERT_TRUE(std::regex_search(fixture_log, fixture, pool)) << fixture_log;
  ServerProcess small(dir_->string(),
                      {"--max_batch_size", "4", "--max_input_len", std::to_string(kMaxInputLen), "--max_output_len",
                       std::to_string(kMaxOutputLen), "--block_size", "8", "--gpu_memory_utilization", "0.01"},
                      testing::scratch_dir() / "serve_small_share.log");
  const std::string small_log = small.log();
  ASSERT_TRUE(std::regex_search(small_log, ours, pool)) << small_log;
  EXPECT_EQ(ours[1], fixture[1]);
  EXPECT_EQ(small.stop(SIGTERM), 0) << small.log();
}

TEST_F(Serve, ModelsHealthAndPrometheusMetrics) {
  const HttpResult health = curl(server_->url() + "/health");
  EXPECT_EQ(health.status, 200);
  const HttpResult models = curl(server_->url() + "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.parsed()["object"], "list");
  ASSERT_EQ(models.parsed()["data"].size(), 1u);
  EXPECT_EQ(models.parsed()["data"][0]["id"], "tiny");

  const auto before = metrics();
  const HttpResult counted = post("/v1/completions", {{"model", "tiny"}, {"prompt", "count me"}, {"max_tokens", 5},
                                                      {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(counted.status, 200) << counted.body;
  const auto after = metrics();
  EXPECT_GT(metric(after, "colossus:kv_blocks_total"), 0);
  EXPECT_EQ(metric(after, "colossus:kv_block_size_tokens"), 8);
  EXPECT_EQ(metric(after, "colossus:generation_tokens_total") - metric(before, "colossus:generation_tokens_total"), 5);
  EXPECT_GT(metric(after, "colossus:prompt_tokens_total"), 0);
  EXPECT_GE(metric(after, "colossus:generation_tokens_per_second"), 0);
  for (const char* name : {"colossus:preemptions_total", "colossus:prefix_cache_hits_total",
                           "colossus:prefix_cache_queries_total", "colossus:requests_waiting", "colossus:requests_running",
                           "colossus:kv_blocks_used", "colossus:engine_steps_total"}) {
    EXPECT_GE(metric(after, name), 0) << name;
  }
  const std::string length = "{model=\"tiny\",finish_reason=\"length\"}";
  EXPECT_EQ(metric(after, "colossus:requests_finished_total", length) -
                metric(before, "colossus:requests_finished_total", length),
            1);
  EXPECT_GE(metric(after, "colossus:http_requests_total", "{endpoint=\"/v1/completions\",status=\"200\"}"), 1);

  // vLLM's names and label, so its Grafana dashboards read ours.
  const std::string vllm = "{model_name=\"tiny\"}";
  EXPECT_EQ(metric(after, "vllm:generation_tokens_total", vllm) - metric(before, "vllm:generation_tokens_total", vllm), 5);
  // vLLM counts a request's whole prompt (prefix-cache hits too); ours beside it counts what prefill computed.
  EXPECT_EQ(metric(after, "vllm:prompt_tokens_total", vllm) - metric(before, "vllm:prompt_tokens_total", vllm),
            counted.parsed()["usage"]["prompt_tokens"].get<double>());
  EXPECT_LE(metric(after, "colossus:prompt_tokens_total") - metric(before, "colossus:prompt_tokens_total"),
            counted.parsed()["usage"]["prompt_tokens"].get<double>());
  for (const char* name : {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                           "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"}) {
    EXPECT_GE(metric(after, name, vllm), 0) << name;
  }
  const std::string success = "{finished_reason=\"length\",model_name=\"tiny\"}";
  EXPECT_EQ(metric(after, "vllm:request_success_total", success) - metric(before, "vllm:request_success_total", success),
            1);
  // Histograms: one first token and one end-to-end latency for the request,
  // four inter-token intervals (5 tokens), buckets cumulative up to +Inf.
  const std::map<std::string, double> counts = {{"vllm:time_to_first_token_seconds", 1},
                                                {"vllm:time_per_output_token_seconds", 4},
                                                {"vllm:e2e_request_latency_seconds", 1}};
  for (const auto& [name, added] : counts) {
    EXPECT_EQ(metric(after, name + "_count", vllm) - metric(before, name + "_count", vllm), added) << name;
    EXPECT_EQ(metric(after, name + "_bucket", "{model_name=\"tiny\",le=\"+Inf\"}"),
              metric(after, name + "_count", vllm)) << name;
    EXPECT_GT(metric(after, name + "_sum", vllm), metric(before, name + "_sum", vllm)) << name;
  }
  EXPECT_LE(metric(after, "vllm:time_to_first_token_seconds_bucket", "{model_name=\"tiny\",le=\"0.001\"}"),
            metric(after, "vllm:time_to_first_token_seconds_bucket", "{model_name=\"tiny\",le=\"2560\"}"));
}

// What a load-test request asks and what must come back.
struct LoadCase {
  bool chat = false;
  bool stream = false;
  std::string prompt;
  int64_t max_tokens = 0;
  std::string expected;
};

// One request through httplib's client; returns the generated text (streams parsed from SSE).
std::string run_case(httplib::Client& client, const LoadCase& c, std::string& error) {
  json body = {{"model", "tiny"}, {"max_tokens", c.max_tokens}, {"temperature", 0}, {"stream", c.stream}};
  if (c.chat) body["messages"] = {{{"role", "user"}, {"content", c.prompt}}};
  else body["prompt"] = c.prompt;
  const auto res = client.Post(c.chat ? "/v1/chat/completions" : "/v1/completions", body.dump(), "application/json");
  if (!res || res->status != 200) {
    error = res ? res->body : httplib::to_string(res.error());
    return {};
  }
  if (!c.stream) {
    const json parsed = json::parse(res->body);
    return c.chat ? parsed["choices"][0]["message"]["content"].get<std::string>()
                  : parsed["choices"][0]["text"].get<std::string>();
  }
  std::string text;
  const auto events = sse_data(res->body);
  if (events.empty() || events.back() != "[DONE]") error = "no [DONE]: " + res->body;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    const json& choice = chunk["choices"][0];
    if (c.chat) text += choice["delta"].value("content", "");
    else text += choice["text"].get<std::string>();
  }
  return text;
}

TEST_F(Serve, ConcurrentLoadEveryResponseMatchesGreedy) {
  // 32 requests from 8 threads: mixed prompt and output lengths, completions
  // and chat, a third of them streamed; the server batches at most 4.
  const std::vector<std::string> prompts = {"a", "Hello world", "The quick brown fox jumps", "0123456789 0123456789 0123",
                                            "Why?", "A longer prompt that takes several KV blocks of eight tokens"};
  std::vector<LoadCase> cases;
  for (int i = 0; i < 32; ++i) {
    const bool chat = i % 4 == 3;
    const std::string& prompt = prompts[static_cast<size_t>(i) % prompts.size()];
    // Chat prompts stay short: the template adds tokens and max_input_len is 64.
    LoadCase c{.chat = chat, .stream = i % 3 == 0, .prompt = chat ? prompt.substr(0, 30) : prompt,
               .max_tokens = 4 + (i * 7) % 45};
    c.expected = c.chat ? greedy(chat_ids({{{"role", "user"}, {"content", c.prompt}}}), c.max_tokens)
                        : greedy(encode(c.prompt), c.max_tokens);
    cases.push_back(std::move(c));
  }
  const double generated_before = metric(metrics(), "colossus:generation_tokens_total");
  std::vector<std::string> got(cases.size()), errors(cases.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", server_->port());
      client.set_read_timeout(60);
      for (size_t i = next++; i < cases.size(); i = next++) got[i] = run_case(client, cases[i], errors[i]);
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(errors[i], "") << "request " << i;
    EXPECT_EQ(got[i], cases[i].expected) << "request " << i << " (" << (cases[i].chat ? "chat" : "completion")
                                         << (cases[i].stream ? ", stream" : "") << ", max_tokens " << cases[i].max_tokens
                                         << ", prompt '" << cases[i].prompt << "')";
  }
  EXPECT_TRUE(wait_idle());
  EXPECT_GT(metric(metrics(), "colossus:generation_tokens_total"), generated_before);
}

TEST_F(Serve, ClientThatHangsUpMidStreamIsAbortedAndItsBlocksFreed) {
  ASSERT_TRUE(wait_idle());
  const std::string abort_labels = "{model=\"tiny\",finish_reason=\"abort\"}";
  const double aborts_before = metric(metrics(), "colossus:requests_finished_total", abort_labels);

  httplib::Client client("127.0.0.1", server_->port());
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{{"model", "tiny"}, {"prompt", "Go on and on"}, {"max_tokens", kMaxOutputLen},
                  {"temperature", 0}, {"ignore_eos", true}, {"stream", true}}
                 .dump();
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // then hang up
  const auto res = client.send(req);
  EXPECT_EQ(chunks, 3);
  EXPECT_FALSE(res);  // cancelled by us

  EXPECT_TRUE(wait_idle()) << "the aborted request still holds blocks";
  const auto after = metrics();
  EXPECT_EQ(metric(after, "colossus:requests_finished_total", abort_labels) - aborts_before, 1);
  EXPECT_EQ(metric(after, "colossus:kv_blocks_used"), 0);
  // The server still serves.
  EXPECT_EQ(post("/v1/completions", {{"model", "tiny"}, {"prompt", "still here"}, {"max_tokens", 3}}).status, 200);
}

TEST_F(Serve, TheOpenAiPythonClientGetsTheGreedyTexts) {
  json cases = {{"completions", json::array()}, {"chat", json::array()}};
  for (const auto& [prompt, max_tokens] : std::vector<std::pair<std::string, int64_t>>{{"Hello", 12}, {"Once upon a time", 30}}) {
    int64_t completion_tokens = 0;
    const std::string expected = greedy(encode(prompt), max_tokens, &completion_tokens);
    cases["completions"].push_back({{"prompt", prompt},
                                    {"max_tokens", max_tokens},
                                    {"expected", expected},
                                    {"prompt_tokens", encode(prompt).size()},
                                    {"completion_tokens", completion_tokens}});
  }
  const nlohmann::ordered_json messages = {{{"role", "system"}, {"content", "You are a test."}},
                                           {{"role", "user"}, {"content", "Say something"}}};
  cases["chat"].push_back({{"messages", json::parse(messages.dump())}, {"max_tokens", 20},
                           {"expected", greedy(chat_ids(messages), 20)}});
  const fs::path cases_file = testing::scratch_dir() / "openai_cases.json";
  std::ofstream(cases_file) << cases.dump(-1, ' ', false, json::error_handler_t::replace);
  const auto result = testing::run_command(fmt::format("'{}' '{}' '{}/v1' tiny '{}' 2>&1", COLOSSUS_PYTHON,
                                                       COLOSSUS_OPENAI_CLIENT, server_->url(), cases_file.string()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("ok"), std::string::npos) << result.output;
}

TEST_F(Serve, APoisonedRequestBesideHealthyOnesFailsNoneOfThem) {
  // The trainer pads the model's vocabulary past the tokenizer's (257 byte ids
  // -> 320 rows): a request sampling at temperature 1e308 (uniform over every
  // row) used to draw ids no text decodes to, and the decode error inside the
  // engine step failed every request in the batch with 503.
  const fs::path padded = testing::scratch_dir() / "padded_vocab";
  models::save_pretrained(*testing::tiny_gpt2(/*vocab=*/320, /*n_positions=*/512), padded.string());
  data::save_byte_tokenizer(padded.string());
  ServerProcess server(padded.string(), {"--served_model_name", "tiny", "--quiet", "--max_batch_size", "8"},
                       testing::scratch_dir() / "serve_padded.log");
  auto complete = [&](const json& body) {
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(60);
    const auto res = client.Post("/v1/completions", body.dump(), "application/json");
    return res ? std::make_pair(res->status, res->body) : std::make_pair(-1, std::string(httplib::to_string(res.error())));
  };
  const json greedy = {{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  const auto [alone_status, alone_body] = complete(greedy);
  ASSERT_EQ(alone_status, 200) << alone_body;
  const std::string alone = json::parse(alone_body)["choices"][0]["text"];
  json poisoned = greedy;
  poisoned["temperature"] = 1e308;
  poisoned["seed"] = 7;
  std::vector<std::pair<int, std::string>> results(7);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = complete(i == 3 ? poisoned : greedy); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_EQ(results[i].first, 200) << "request " << i << ": " << results[i].second << "\n" << server.log();
    const json body = json::parse(results[i].second);
    EXPECT_EQ(body["usage"]["completion_tokens"], 24) << i;
    if (i != 3) {
      EXPECT_EQ(body["choices"][0]["text"], alone) << "greedy request " << i;
    }
  }
}

TEST_F(Serve, ApiKeyAndForeignOriginsAreRefused) {
  ServerProcess guarded(dir_->string(),
                        {"--served_model_name", "tiny", "--quiet", "--api_key", "s3cret", "--allowed_origins",
                         "http://localhost:3000"},
                        testing::scratch_dir() / "serve_guarded.log");
  httplib::Client client("127.0.0.1", guarded.port());
  const std::string body = R"({"model": "tiny", "prompt": "hi", "max_tokens": 2})";
  auto post = [&](const httplib::Headers& headers) {
    const auto res = client.Post("/v1/completions", headers, body, "application/json");
    return res ? res->status : -1;
  };
  EXPECT_EQ(post({}), 401);
  EXPECT_EQ(post({{"Authorization", "Bearer wrong"}}), 401);
  EXPECT_EQ(post({{"Authorization", "Bearer s3cre"}}), 401);
  EXPECT_EQ(post({{"Authorization", "Bearer s3cret"}}), 200);
  const auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  EXPECT_NE(models->body.find("invalid_api_key"), std::string::npos) << models->body;
  const auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << "health checks need no key";
  // As vLLM's: the key guards the /v1 routes; Prometheus and tokenizer calls need none.
  const auto scraped = client.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_EQ(scraped->status, 200) << scraped->body;
  const auto tokenized = client.Post("/tokenize", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(tokenized);
  EXPECT_EQ(tokenized->status, 200) << tokenized->body;
  // A page in a browser: its Origin must be allowed, key or not.
  EXPECT_EQ(post({{"Authorization", "Bearer s3cret"}, {"Origin", "http://evil.example"}}), 403);
  EXPECT_EQ(post({{"Authorization", "Bearer s3cret"}, {"Origin", "http://localhost:3000"}}), 200);
  // ... and the browser shows the page the response only when CORS headers allow it,
  // after a preflight that carries no key.
  const auto allowed = client.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}, {"Origin", "http://localhost:3000"}},
                                   body, "application/json");
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  const auto preflight = client.Options("/v1/completions", {{"Origin", "http://localhost:3000"},
                                                            {"Access-Control-Request-Method", "POST"},
                                                            {"Access-Control-Request-Headers", "authorization,content-type"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  const auto foreign_preflight = client.Options("/v1/completions", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(foreign_preflight);
  EXPECT_EQ(foreign_preflight->status, 403);
  EXPECT_TRUE(foreign_preflight->get_header_value("Access-Control-Allow-Origin").empty());
  // Without --allowed_origins every Origin is foreign.
  const auto foreign = httplib::Client("127.0.0.1", server_->port())
                           .Post("/v1/completions", {{"Origin", "http://localhost:8000"}}, body, "application/json");
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->status, 403);
  EXPECT_NE(foreign->body.find("--allowed_origins"), std::string::npos) << foreign->body;
}

namespace raw {

// A loopback TCP connection that the test drives byte by byte.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// What the server sends within timeout_s, until it closes the connection.
std::string read_until_closed(int fd, double timeout_s) {
  timeval tv{static_cast<time_t>(timeout_s), static_cast<suseconds_t>((timeout_s - static_cast<int>(timeout_s)) * 1e6)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace raw

// Issue 21, class 5: clients that trickle their headers a byte at a time
// held every worker for as long as they kept trickling (httplib's read
// timeout restarts with each byte); now a connection without a whole request
// within --request_timeout is cut with 408, so a healthy request queued
// behind them is served; and connections beyond --max_connections get 503
// at once instead of queueing without bound.
TEST_F(Serve, SlowClientsAreCutAndConnectionsAreCapped) {
  ServerProcess guarded(dir_->string(),
                        {"--served_model_name", "tiny", "--quiet", "--threads", "2", "--max_connections", "3",
                         "--request_timeout", "1"},
                        testing::scratch_dir() / "serve_slow.log");
  std::atomic<bool> trickling{true};
  std::vector<std::thread> tricklers;
  std::vector<std::string> answers(2);
  for (int i = 0; i < 2; ++i) {
    tricklers.emplace_back([&, i] {
      const int fd = raw::connect_to(guarded.port());
      ASSERT_GE(fd, 0);
      const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(200, 'a');
      // One byte every 200 ms for up to 40 s; stop sending once the server
      // answers (bytes sent after its close would make it reset the connection).
      for (size_t k = 0; k < request.size() && trickling; ++k) {
        if (::send(fd, &request[k], 1, MSG_NOSIGNAL) != 1) break;
        pollfd answer{fd, POLLIN, 0};
        if (::poll(&answer, 1, 200) > 0) break;
      }
      answers[i] = raw::read_until_closed(fd, 1);
      ::close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both workers now hold a trickler
  // A third connection queues for a worker; a fourth is over the limit of 3.
  const auto start = std::chrono::steady_clock::now();
  std::thread healthy_client([&] {
    httplib::Client client("127.0.0.1", guarded.port());
    client.set_read_timeout(30, 0);
    const auto res = client.Post("/v1/completions", R"({"model": "tiny", "prompt": "hi", "max_tokens": 2})",
                                 "application/json");
    EXPECT_TRUE(res);
    if (res) {
      EXPECT_EQ(res->status, 200) << res->body;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int extra = raw::connect_to(guarded.port());
  ASSERT_GE(extra, 0);
  const std::string refused = raw::read_until_closed(extra, 5);
  ::close(extra);
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << "a connection over --max_connections: " << refused;
  EXPECT_NE(refused.find("--max_connections"), std::string::npos) << refused;
  healthy_client.join();
  const double healthy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trickling = false;
  for (auto& t : tricklers) t.join();
  EXPECT_LT(healthy_s, 10) << "the healthy request waited for the tricklers (they trickle for 40 s)";
  for (const auto& answer : answers) {
    EXPECT_EQ(answer.rfind("HTTP/1.1 408", 0), 0u) << "a trickling client is cut with 408: " << answer;
  }
  EXPECT_EQ(guarded.stop(SIGTERM), 0) << guarded.log();
}

TEST_F(Serve, LoadThenSigtermWithRequestsInFlight) {
  // The check scripts/device_serve_smoke.sh runs on the GPU, here on a second
  // server: 64 requests from 16 clients against their single-request texts,
  // every KV block free afterwards, then SIGTERM while 8 long requests run.
  const auto result = testing::run_command(fmt::format(
      "'{}' '{}' --bin '{}' --model '{}' --requests 64 --clients 16 --max-tokens 24 --inflight 8 -- "
      "--max_batch_size 4 --max_input_len {} --max_output_len {} --block_size 8 --threads 32 2>&1",
      COLOSSUS_PYTHON, COLOSSUS_SERVE_LOAD_CHECK, COLOSSUS_BIN, dir_->string(), kMaxInputLen, kMaxOutputLen));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("serve load check: PASS"), std::string::npos) << result.output;
}

TEST_F(Serve, SigtermShutsDownGracefully) {
  ServerProcess second(dir_->string(), {"--served_model_name", "tiny", "--quiet"},
                       testing::scratch_dir() / "serve_sigterm.log");
  httplib::Client client("127.0.0.1", second.port());
  const auto res = client.Post("/v1/completions", R"({"model": "tiny", "prompt": "bye", "max_tokens": 4})",
                               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(second.stop(SIGTERM), 0) << second.log();
  EXPECT_NE(second.log().find("SIGTERM: shutting down"), std::string::npos) << second.log();
  EXPECT_NE(second.log().find("stopped"), std::string::npos) << second.log();

  ServerProcess third(dir_->string(), {"--quiet"}, testing::scratch_dir() / "serve_sigint.log");
  EXPECT_EQ(third.stop(SIGINT), 0) << third.log();
}

}  // namespace
}  // namespace colossus::inference
