// `colossus generate --chat` through the real binary: user lines piped into
// stdin, each reply streamed to stdout and equal to full-recompute greedy
// decoding of the conversation so far, rendered by the model's chat template
// (or by plain "role: content" lines when the directory has none).
#include "colossus/data/corpus.h"
#include "colossus/data/tokenizer.h"
#include "colossus/inference/generate.h"
#include "colossus/inference/serving/chat_prompt.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>

namespace colossus::inference {
namespace {

namespace fs = std::filesystem;

// The replies a greedy chat gives to `lines`, each followed by a newline, as the CLI prints them.
std::string expected_chat(models::CausalLM& model, const data::Tokenizer& tokenizer,
                          const serving::ChatPrompt& chat, const std::vector<std::string>& lines, int64_t max_new) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::string out;
  for (const auto& line : lines) {
    messages.push_back({{"role", "user"}, {"content", line}});
    const auto ids32 = tokenizer.encode(chat.render(messages), chat.add_special_tokens());
    const std::vector<int64_t> ids(ids32.begin(), ids32.end());
    const auto all = generate(model, ids, {.max_new_tokens = max_new, .sampling = {.do_sample = false},
                                           .eos_id = tokenizer.eos_id()});
    const std::vector<int32_t> reply_ids(all.begin() + static_cast<int64_t>(ids.size()), all.end());
    const std::string reply = tokenizer.decode(reply_ids, /*skip_special_tokens=*/true);
    out += reply + "\n";
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return out;
}

class ChatCli : public ::testing::TestWithParam<bool> {};

TEST_P(ChatCli, RepliesToPipedLinesKeepingTheConversation) {
  const bool with_template = GetParam();
  const fs::path dir = testing::scratch_dir() / (with_template ? "chat_template_model" : "chat_plain_model");
  auto model = testing::tiny_gpt2(/*vocab=*/257, /*n_positions=*/256);
  models::save_pretrained(*model, dir.string());
  data::save_byte_tokenizer(dir.string());
  if (with_template) {
    std::ofstream(dir / "chat_template.jinja")
        << "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
           "{% if add_generation_prompt %}[assistant] {% endif %}";
  }
  const auto chat = serving::ChatPrompt::from_model_dir(dir.string());
  ASSERT_EQ(chat.has_template(), with_template);
  const auto tokenizer = data::load_tokenizer(dir.string());
  const std::vector<std::string> lines = {"Hello there", "And then?", "Tell me more"};
  const std::string expected = expected_chat(*model, *tokenizer, chat, lines, 10);

  const fs::path err = testing::scratch_dir() / "chat_stderr.txt";
  const auto result = testing::run_command(
      fmt::format("printf 'Hello there\\nAnd then?\\n\\nTell me more\\n/exit\\nnot read\\n' | '{}' generate '{}' --chat "
                  "--greedy --max_new_tokens 10 2>'{}'",
                  COLOSSUS_BIN, dir.string(), err.string()));
  std::ifstream in(err);
  const std::string stderr_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(result.exit_code, 0) << stderr_text;
  EXPECT_EQ(result.output, expected);
  EXPECT_NE(stderr_text.find(with_template ? "the model's chat template" : "plain role: content"), std::string::npos)
      << stderr_text;

  // End of input ends it too, and /reset forgets the conversation.
  const auto reset = testing::run_command(fmt::format(
      "printf 'Hello there\\n/reset\\nHello there' | '{}' generate '{}' --chat --greedy --max_new_tokens 10 2>/dev/null",
      COLOSSUS_BIN, dir.string()));
  ASSERT_EQ(reset.exit_code, 0);
  const std::string first = expected_chat(*model, *tokenizer, chat, {"Hello there"}, 10);
  EXPECT_EQ(reset.output, first + first);
}

INSTANTIATE_TEST_SUITE_P(TemplateOrPlain, ChatCli, ::testing::Bool());

}  // namespace
}  // namespace colossus::inference
