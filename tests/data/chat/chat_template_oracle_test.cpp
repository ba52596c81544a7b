// ChatTemplate against transformers: real chat templates of several model
// families (tests/inference/serving/templates/) applied to several
// conversations, byte for byte against tokenizer.apply_chat_template, and the
// feature cases of chat_template_cases.h against transformers' Jinja
// environment. Python runs once, on all jobs (render_chat_template.py).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "colossus/data/chat/chat_template.h"
#include "tests/data/chat/chat_template_cases.h"
#include "tests/testing/command.h"

namespace colossus::data::chat {
namespace {

using nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct TemplateFile {
  std::string file;
  ChatTemplate::SpecialTokens tokens;
};

const std::vector<TemplateFile>& template_files() {
  static const std::vector<TemplateFile> files = {
      {"chatml_qwen2.jinja", {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}}},
      {"llama3_instruct.jinja", {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}}},
      {"llama2_mistral_inst.jinja", {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}}},
      {"zephyr.jinja", {{"bos_token", "<s>"}, {"eos_token", "</s>"}}},
      {"gemma.jinja", {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"pad_token", "<pad>"}}},
      {"qwen3_namespace_tools.jinja", {{"eos_token", "<|im_end|>"}}},
  };
  return files;
}

struct Conversation {
  std::string name;
  const char* messages;
  const char* extra = "{}";
};

const std::vector<Conversation>& conversations() {
  static const std::vector<Conversation> all = {
      {"system_user", R"([{"role": "system", "content": "You are terse."},
                          {"role": "user", "content": "Hi there! ¿Qué tal? 👋"}])"},
      {"user_only", R"([{"role": "user", "content": "  What is 2+2?\n"}])"},
      {"multi_turn", R"([{"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": "Hi! How can I help?"},
                         {"role": "user", "content": "Tell me a joke.\nA short one."}])"},
      {"system_multi_turn", R"([{"role": "system", "content": "Be kind.\n"},
                                {"role": "user", "content": "One"},
                                {"role": "assistant", "content": " Two "},
                                {"role": "user", "content": "Three"}])"},
      {"two_users", R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"},
      {"assistant_first", R"([{"role": "assistant", "content": "I start"}, {"role": "user", "content": "ok"}])"},
      {"reasoning", R"([{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
                        {"role": "user", "content": "3+3?"},
                        {"role": "assistant", "content": "6", "reasoning_content": "add again"}])",
       R"({"enable_thinking": false})"},
      {"tools", R"([{"role": "system", "content": "Use tools."},
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
                        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                    {"role": "tool", "content": "{\"temp\": 21.5}"},
                    {"role": "tool", "content": "sunny"},
                    {"role": "assistant", "content": "It is 21.5 °C and sunny."}])",
       R"({"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]})"},
  };
  return all;
}

std::string job_name(const TemplateFile& t, const Conversation& c, bool add_generation_prompt) {
  return t.file + "/" + c.name + (add_generation_prompt ? "/generation_prompt" : "");
}

// Every job's result from Python, by name: {"text": ...} or {"error": "Type: message"}.
const std::map<std::string, ordered_json>& oracle() {
  static const std::map<std::string, ordered_json> results = [] {
    ordered_json jobs = ordered_json::array();
    std::vector<std::string> names;
    for (const TemplateFile& t : template_files()) {
      const std::string source = read_file(std::string(COLOSSUS_CHAT_TEMPLATES) + "/" + t.file);
      for (const Conversation& c : conversations()) {
        for (bool generation_prompt : {false, true}) {
          ordered_json tokens = ordered_json::object();
          for (const auto& [name, token] : t.tokens) tokens[name] = token;
          jobs.push_back({{"template", source},
                          {"messages", ordered_json::parse(c.messages)},
                          {"add_generation_prompt", generation_prompt},
                          {"special_tokens", tokens},
                          {"kwargs", ordered_json::parse(c.extra)}});
          names.push_back(job_name(t, c, generation_prompt));
        }
      }
    }
    for (const testing::FeatureCase& f : testing::feature_cases()) {
      jobs.push_back({{"template", f.template_source}, {"context", ordered_json::parse(f.context)}});
      names.push_back(std::string("feature/") + f.name);
    }
    const auto dir = colossus::testing::scratch_dir("chat_template");
    const auto jobs_path = dir / "oracle_jobs.json";
    std::ofstream(jobs_path) << jobs.dump();
    const auto result =
        colossus::testing::run_command(std::string(COLOSSUS_PYTHON) + " " + COLOSSUS_CHAT_TEMPLATE_ORACLE + " " +
                                       jobs_path.string() + " 2>" + (dir / "oracle_stderr.txt").string());
    std::map<std::string, ordered_json> by_name;
    if (result.exit_code != 0) return by_name;  // the tests report the missing results
    const ordered_json rendered = ordered_json::parse(result.output);
    for (size_t i = 0; i < names.size() && i < rendered.size(); ++i) by_name[names[i]] = rendered[i];
    return by_name;
  }();
  return results;
}

const ordered_json& oracle_result(const std::string& name) {
  static const ordered_json missing = {{"error", "no result from render_chat_template.py (see oracle_stderr.txt)"}};
  const auto it = oracle().find(name);
  return it == oracle().end() ? missing : it->second;
}

class RealTemplate : public ::testing::TestWithParam<TemplateFile> {};

TEST_P(RealTemplate, MatchesTransformersOnEveryConversation) {
  const TemplateFile& t = GetParam();
  const ChatTemplate chat_template(read_file(std::string(COLOSSUS_CHAT_TEMPLATES) + "/" + t.file), t.tokens);
  int rendered = 0, raised = 0;
  for (const Conversation& c : conversations()) {
    for (bool generation_prompt : {false, true}) {
      const std::string name = job_name(t, c, generation_prompt);
      SCOPED_TRACE(name);
      const ordered_json& expected = oracle_result(name);
      ASSERT_TRUE(expected.contains("text") || expected.contains("error")) << expected.dump();
      std::string ours, our_error;
      try {
        ours = chat_template.apply(ordered_json::parse(c.messages), generation_prompt, ordered_json::parse(c.extra));
      } catch (const ChatTemplateRaised& e) {
        our_error = std::string("TemplateError: ") + e.what();
      } catch (const ConfigError& e) {
        our_error = std::string("ConfigError: ") + e.what();
      }
      if (expected.contains("text")) {
        EXPECT_EQ(our_error, "");
        EXPECT_EQ(ours, expected["text"].get<std::string>());
        ++rendered;
        continue;
      }
      // raise_exception must carry the template's own message; Python's other
      // errors (undefined values in arithmetic) must be errors here too.
      const std::string python_error = expected["error"].get<std::string>();
      ASSERT_FALSE(python_error.starts_with("no result")) << python_error;
      if (python_error.starts_with("TemplateError: ")) {
        EXPECT_EQ(our_error, python_error);
        ++raised;
      } else {
        EXPECT_TRUE(our_error.starts_with("ConfigError: ")) << "Python: " << python_error << "\nours: " << ours;
      }
    }
  }
  EXPECT_GT(rendered, 0);
  RecordProperty("rendered", rendered);
  RecordProperty("raised", raised);
}

INSTANTIATE_TEST_SUITE_P(ChatTemplateOracle, RealTemplate, ::testing::ValuesIn(template_files()),
                         [](const ::testing::TestParamInfo<TemplateFile>& info) {
                           std::string name = info.param.file.substr(0, info.param.file.find('.'));
                           return name;
                         });

TEST(ChatTemplateOracle, FeatureCasesAreJinjasOutput) {
  for (const testing::FeatureCase& f : testing::feature_cases()) {
    SCOPED_TRACE(f.name);
    const ordered_json& expected = oracle_result(std::string("feature/") + f.name);
    ASSERT_TRUE(expected.contains("text")) << expected.dump();
    EXPECT_EQ(expected["text"].get<std::string>(), f.expected);
  }
}

TEST(ChatTemplateOracle, TemplatesRaiseOnBadRoleOrderAsTransformers) {
  // The raising templates must have raised somewhere, so the comparison above covered raise_exception.
  for (const char* name :
       {"llama2_mistral_inst.jinja/two_users", "gemma.jinja/assistant_first", "gemma.jinja/system_user"}) {
    SCOPED_TRACE(name);
    const ordered_json& expected = oracle_result(name);
    ASSERT_TRUE(expected.contains("error")) << expected.dump();
    EXPECT_TRUE(expected["error"].get<std::string>().starts_with("TemplateError: ")) << expected.dump();
  }
}

}  // namespace
}  // namespace colossus::data::chat
