// `colossus serve --tensor_parallel_size 2` end to end on the CPU: the real
// binary starts its two ranks itself (under mpirun, as `colossus run` does)
// and rank 0 serves a tiny LLaMA (4 heads, 2 kv heads) over HTTP. Its
// completions (greedy prompts in one request and from concurrent clients,
// n = 2 seeded samples, a stream, a chat, a stop string) equal a one-process
// server's on the same weights; /health, /metrics and the log say the tp
// size; a client that hangs up is aborted on every rank; SIGTERM ends every
// rank with exit 0. Sizes that cannot work are refused by name before any
// rank starts; the step commands' bytes carry every request option.
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/inference/serving/tensor_parallel_steps.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/serving/server_process.h"
#include "tests/inference/support.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

namespace colossus::inference {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::ServerProcess;

const std::vector<std::string> kServerArgs = {"--served_model_name", "tiny", "--max_batch_size", "4", "--max_input_len",
                                              "32", "--max_output_len", "400", "--block_size", "8", "--quiet"};

struct Reply {
  int status = 0;
  json body;
};

Reply post(int port, const std::string& path, const json& request) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  const auto res = client.Post(path, request.dump(), "application/json");
  if (!res) return {};
  return {res->status, res->get_header_value("Content-Type").rfind("text/event-stream", 0) == 0
                           ? json(res->body)
                           : json::parse(res->body, nullptr, /*allow_exceptions=*/false)};
}

// The text of each choice of an SSE body, by index.
std::map<int64_t, std::string> stream_texts(const std::string& body) {
  std::map<int64_t, std::string> texts;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    for (const json& choice : chunk["choices"]) {
      texts[choice["index"].get<int64_t>()] += choice["text"].get<std::string>();
    }
  }
  return texts;
}

class ServeTensorParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(testing::scratch_dir() / "tiny_llama");
    // tiny_llama with room for a long generation (the hang-up test).
    models::save_pretrained(*testing::tiny_llama(257, /*max_positions=*/512), dir_->string());
    data::save_byte_tokenizer(dir_->string());
    // Both start at once: two loads and an mpirun overlap.
    std::thread single(
        [] { one_ = new ServerProcess(dir_->string(), kServerArgs, testing::scratch_dir() / "one.log"); });
    std::vector<std::string> tp_args = kServerArgs;
    tp_args.insert(tp_args.end(), {"-tp", "2"});
    tp_ = new ServerProcess(dir_->string(), tp_args, testing::scratch_dir() / "tp.log", 120);
    single.join();
  }
  static void TearDownTestSuite() {
    delete tp_;
    delete one_;
    delete dir_;
  }

  // The same request to both servers: equal statuses and choices.
  static void expect_same_choices(const json& request, const std::string& path = "/v1/completions") {
    const Reply one = post(one_->port(), path, request), tp = post(tp_->port(), path, request);
    ASSERT_EQ(one.status, 200) << request.dump() << " -> " << one.body.dump();
    ASSERT_EQ(tp.status, 200) << request.dump() << " -> " << tp.body.dump();
    if (request.value("stream", false)) {
      EXPECT_EQ(stream_texts(tp.body.get<std::string>()), stream_texts(one.body.get<std::string>())) << request.dump();
      return;
    }
    EXPECT_EQ(tp.body["choices"], one.body["choices"]) << request.dump();
    EXPECT_EQ(tp.body["usage"], one.body["usage"]) << request.dump();
  }

  static double metric(int port, const std::string& sample) {
    httplib::Client client("127.0.0.1", port);
    const auto res = client.Get("/metrics");
    if (!res) return -1;
    std::smatch match;
    const std::regex line("(^|\n)" + std::regex_replace(sample, std::regex(R"([{}\[\]()*+?.^$|\\])"), R"(\$&)") +
                          " ([-0-9.e+]+)");
    return std::regex_search(res->body, match, line) ? std::stod(match[2]) : -1;
  }

  static fs::path* dir_;
  static ServerProcess* one_;
  static ServerProcess* tp_;
};

fs::path* ServeTensorParallel::dir_ = nullptr;
ServerProcess* ServeTensorParallel::one_ = nullptr;
ServerProcess* ServeTensorParallel::tp_ = nullptr;

TEST_F(ServeTensorParallel, CompletionsEqualTheOneProcessServers) {
  // Greedy, several prompts in one request (batched together).
  expect_same_choices({{"model", "tiny"}, {"prompt", {"Once upon a time", "The capital of", "ab"}}, {"max_tokens", 12},
                       {"temperature", 0}, {"ignore_eos", true}});
  // Two seeded samples of one prompt: the seeds rank 0 resolves reach rank 1.
  expect_same_choices({{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 10}, {"temperature", 0.9},
                       {"seed", 7}, {"n", 2}, {"ignore_eos", true}});
  // Token ids, a stop string, penalties; a stream; a chat (plain role: content lines).
  expect_same_choices({{"model", "tiny"}, {"prompt", {{72, 101, 108, 108, 111}}}, {"max_tokens", 16},
                       {"temperature", 0}, {"stop", {"e"}}, {"presence_penalty", 0.5}, {"frequency_penalty", 0.5}});
  expect_same_choices({{"model", "tiny"}, {"prompt", "Stream me"}, {"max_tokens", 9}, {"temperature", 0},
                       {"ignore_eos", true}, {"stream", true}});
  expect_same_choices({{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 6},
                       {"temperature", 0}, {"ignore_eos", true}},
                      "/v1/chat/completions");
  // A submission the engine refuses (its second prompt holds a token id past
  // the vocabulary, after the first was added) is refused on every rank
  // alike, and the ranks still agree afterwards.
  const json refused = {{"model", "tiny"}, {"prompt", {{5, 6}, {5, 9999}}}, {"max_tokens", 3}};
  const Reply one = post(one_->port(), "/v1/completions", refused), tp = post(tp_->port(), "/v1/completions", refused);
  EXPECT_EQ(one.status, 400) << one.body.dump();
  EXPECT_EQ(tp.status, 400) << tp.body.dump();
  EXPECT_EQ(tp.body["error"]["message"], one.body["error"]["message"]);
  expect_same_choices({{"model", "tiny"}, {"prompt", "after"}, {"max_tokens", 5}, {"temperature", 0},
                       {"ignore_eos", true}});
}

TEST_F(ServeTensorParallel, ConcurrentClientsGetTheOneProcessTexts) {
  // Requests joining and leaving the batch at different steps: every rank
  // admits them in rank 0's order.
  const std::vector<std::string> prompts = {"a", "Hello world", "The quick brown fox", "0123456789", "Why?", "xyz"};
  std::vector<json> expected, got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const json request = {{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 4 + 3 * static_cast<int>(i)},
                          {"temperature", 0}, {"ignore_eos", true}};
    expected.push_back(post(one_->port(), "/v1/completions", request).body["choices"]);
  }
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      got[i] = post(tp_->port(), "/v1/completions",
                    {{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 4 + 3 * static_cast<int>(i)},
                     {"temperature", 0}, {"ignore_eos", true}})
                   .body["choices"];
    });
  }
  for (auto& client : clients) client.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "prompt '" << prompts[i] << "'";
}

TEST_F(ServeTensorParallel, AClientThatHangsUpIsAbortedOnEveryRank) {
  httplib::Client client("127.0.0.1", tp_->port());
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = json{{"model", "tiny"}, {"prompt", "Go on"}, {"max_tokens", 400}, {"temperature", 0},
                  {"ignore_eos", true}, {"stream", true}}
                 .dump();
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };  // then hang up
  EXPECT_FALSE(client.send(req));
  // Rank 0 told rank 1 of the abort: both still agree, and the blocks come back.
  expect_same_choices({{"model", "tiny"}, {"prompt", "still here"}, {"max_tokens", 5}, {"temperature", 0},
                       {"ignore_eos", true}});
  const std::string labels = "{model=\"tiny\"}";
  for (int i = 0; i < 100 && metric(tp_->port(), "colossus:kv_blocks_used" + labels) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(metric(tp_->port(), "colossus:kv_blocks_used" + labels), 0);
  EXPECT_EQ(metric(tp_->port(), "colossus:requests_finished_total{model=\"tiny\",finish_reason=\"abort\"}"), 1);
}

TEST_F(ServeTensorParallel, HealthMetricsAndLogSayTheTpSize) {
  httplib::Client client("127.0.0.1", tp_->port());
  const auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["tensor_parallel_size"], 2) << health->body;
  EXPECT_EQ(metric(tp_->port(), "colossus:tensor_parallel_size{model=\"tiny\"}"), 2);
  EXPECT_EQ(metric(one_->port(), "colossus:tensor_parallel_size{model=\"tiny\"}"), 1);
  const std::string log = tp_->log();
  EXPECT_NE(log.find("tensor_parallel_size 2: starting 2 ranks (mpi, cpu)"), std::string::npos) << log;
  EXPECT_NE(log.find("[r0] loaded "), std::string::npos) << log;
  EXPECT_NE(log.find("tensor_parallel_size 2 over mpi) in"), std::string::npos) << log;
  EXPECT_NE(log.find("on http://127.0.0.1:" + std::to_string(tp_->port()) + " (tensor_parallel_size 2, "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("[r1] rank 1 of 2: loaded; following rank 0's steps"), std::string::npos) << log;
}

TEST_F(ServeTensorParallel, SizesThatCannotWorkAreRefusedBeforeAnyRankStarts) {
  const auto serve = [&](const std::string& args, const std::string& env = "") {
    return testing::run_command(fmt::format("{} '{}' serve '{}' {} 2>&1", env, COLOSSUS_BIN, dir_->string(), args));
  };
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--tensor_parallel_size 0", "--tensor_parallel_size 0: use 1 (one process) or more ranks"},
      {"-tp 3",
       "--tensor_parallel_size 3 does not split this llama model: tp_size = 3 does not divide the 4 attention heads; "
       "use a divisor of 4; sizes that do: 1, 2, 4"},
      {"--tensor-parallel-size 2 --device cuda:1", "--device cuda:1 names one GPU, but --tensor_parallel_size 2"},
      {fmt::format("-tp 2 --port {}", one_->port()),
       fmt::format("cannot listen on port {}: it is in use on this machine", one_->port())}};
  for (const auto& [args, message] : refused) {
    const auto result = serve(args);
    EXPECT_EQ(result.exit_code, 1) << args << ": " << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << args << ": " << result.output;
    EXPECT_EQ(result.output.find("[r0]"), std::string::npos) << args << " started ranks: " << result.output;
  }
  // More ranks than GPUs (none on a CPU machine).
  if (at::getNumGPUs() < 4) {
    const auto gpus = serve("-tp 4 --device cuda");
    EXPECT_EQ(gpus.exit_code, 1) << gpus.output;
    EXPECT_NE(gpus.output.find("--tensor_parallel_size 4 runs one rank per GPU but"), std::string::npos) << gpus.output;
  }
  // Started as one rank of a job whose size is not the tp size.
  const auto job = serve("-tp 2", "RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3");
  EXPECT_EQ(job.exit_code, 1) << job.output;
  EXPECT_NE(job.output.find("rank 0 of a 3-rank job, but --tensor_parallel_size is 2"), std::string::npos)
      << job.output;
}

TEST(StepCommands, EveryFieldRoundTripsAndCutBytesAreRefused) {
  using serving::StepCommands;
  RequestOptions full{.max_new_tokens = 9,
                      .sampling = SamplingParams{.do_sample = true,
                                                 .temperature = 0.7,
                                                 .top_k = 5,
                                                 .top_p = 0.9,
                                                 .repetition_penalty = 1.1,
                                                 .seed = 0xFEDCBA9876543210ull,
                                                 .presence_penalty = -0.5,
                                                 .frequency_penalty = 1.25},
                      .no_repeat_ngram_size = 3,
                      .ignore_eos = true,
                      .beam_width = 1,
                      .stop = {"\n\n", "", "é"},
                      .logprobs = 2,
                      .prompt_logprobs = 0};
  const StepCommands commands{
      .submissions = {{.prompts = {{1, 2, 3}, {256}}, .options = {full, RequestOptions{}}, .ids = {7, 8}},
                      {.prompts = {{4}}, .options = {RequestOptions{.stop = {"x"}}}, .ids = {}}},
      .aborts = {3, 5},
      .step = true,
      .stop = true};
  const std::string bytes = serving::encode_step_commands(commands);
  const StepCommands back = serving::decode_step_commands(bytes);
  ASSERT_EQ(back.submissions.size(), 2u);
  const RequestOptions& o = back.submissions[0].options[0];
  EXPECT_EQ(o.max_new_tokens, 9);
  ASSERT_TRUE(o.sampling);
  EXPECT_TRUE(o.sampling->do_sample);
  EXPECT_EQ(o.sampling->temperature, 0.7);
  EXPECT_EQ(o.sampling->top_k, 5);
  EXPECT_EQ(o.sampling->top_p, 0.9);
  EXPECT_EQ(o.sampling->repetition_penalty, 1.1);
  EXPECT_EQ(o.sampling->seed, 0xFEDCBA9876543210ull);
  EXPECT_EQ(o.sampling->presence_penalty, -0.5);
  EXPECT_EQ(o.sampling->frequency_penalty, 1.25);
  EXPECT_EQ(o.no_repeat_ngram_size, 3);
  EXPECT_EQ(o.ignore_eos, true);
  EXPECT_EQ(o.beam_width, 1);
  EXPECT_EQ(o.stop, full.stop);
  EXPECT_EQ(o.logprobs, 2);
  EXPECT_EQ(o.prompt_logprobs, 0);
  const RequestOptions& empty = back.submissions[0].options[1];
  EXPECT_FALSE(empty.max_new_tokens || empty.sampling || empty.no_repeat_ngram_size || empty.ignore_eos ||
               empty.beam_width || empty.logprobs || empty.prompt_logprobs);
  EXPECT_EQ(back.submissions[0].prompts, commands.submissions[0].prompts);
  EXPECT_EQ(back.submissions[0].ids, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(back.submissions[1].options[0].stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(back.submissions[1].ids.empty());
  EXPECT_EQ(back.aborts, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(back.step);
  EXPECT_TRUE(back.stop);
  // An idle heartbeat is a few bytes; cut or padded bytes are refused, not misread.
  EXPECT_LT(serving::encode_step_commands({}).size(), 32u);
  for (size_t cut : {size_t{0}, size_t{5}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_THROW(serving::decode_step_commands(bytes.substr(0, cut)), DistError) << cut << " bytes";
  }
  EXPECT_THROW(serving::decode_step_commands(bytes + "x"), DistError);
}

// Last: it stops the tensor-parallel server.
TEST_F(ServeTensorParallel, SigtermEndsEveryRankWithExitZero) {
  // The launcher forwards it to both ranks: rank 0 drains and tells rank 1
  // to stop (rank 1 never acts on a signal itself); the launcher reports the
  // signal as `colossus run` does.
  // A request in flight finishes first.
  Reply in_flight;
  std::thread client([&] {
    in_flight = post(tp_->port(), "/v1/completions",
                     {{"model", "tiny"}, {"prompt", "Last one"}, {"max_tokens", 200}, {"temperature", 0},
                      {"ignore_eos", true}});
  });
  for (int i = 0; i < 200 && metric(tp_->port(), "colossus:requests_running{model=\"tiny\"}") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int code = tp_->stop(SIGTERM, 30);
  client.join();
  const std::string log = tp_->log();
  EXPECT_EQ(in_flight.status, 200) << in_flight.body.dump();
  EXPECT_EQ(in_flight.body["usage"]["completion_tokens"], 200) << in_flight.body.dump();
  EXPECT_EQ(code, 128 + SIGTERM) << log;
  EXPECT_NE(log.find("[r0] SIGTERM: shutting down"), std::string::npos) << log;
  EXPECT_NE(log.find("[r0] stopped"), std::string::npos) << log;
  EXPECT_NE(log.find("[r1] rank 1 of 2: stopped"), std::string::npos) << log;
  EXPECT_NE(log.find("colossus run: got SIGTERM; stopped 2 ranks"), std::string::npos) << log;
  EXPECT_EQ(log.find("killed"), std::string::npos) << "a rank did not stop by itself: " << log;
  EXPECT_EQ(log.find("error"), std::string::npos) << log;
}

}  // namespace
}  // namespace colossus::inference
