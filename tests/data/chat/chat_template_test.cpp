// ChatTemplate without Python: every language feature against Jinja's exact
// output (chat_template_cases.h), errors that name the position and the
// culprit, apply()'s message handling and loading from a model directory.
#include "colossus/data/chat/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "tests/data/chat/chat_template_cases.h"
#include "tests/testing/command.h"

namespace colossus::data::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string render(const std::string& source, const std::string& context = "{}") {
  return ChatTemplate(source).render(ordered_json::parse(context));
}

// The ConfigError message of parsing and rendering `source`, or "no error".
std::string error_of(const std::string& source, const std::string& context = "{}") {
  try {
    render(source, context);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

#define EXPECT_CONTAINS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(ChatTemplate, FeaturesRenderAsJinja) {
  for (const testing::FeatureCase& c : testing::feature_cases()) {
    SCOPED_TRACE(c.name);
    try {
      EXPECT_EQ(render(c.template_source, c.context), c.expected);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

TEST(ChatTemplate, StrftimeNowFormatsLocalTime) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char year[8];
  std::strftime(year, sizeof(year), "%Y", &local);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), year);
  EXPECT_EQ(render("{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') | length }}{% endif %}"), "11");
}

TEST(ChatTemplate, SyntaxErrorsNameThePositionAndWhatWasExpected) {
  const std::string unclosed_if = error_of("ab\n{% if x %}abc");
  EXPECT_CONTAINS(unclosed_if, "line 2, column 1");
  EXPECT_CONTAINS(unclosed_if, "'{% if %}' is never closed");
  EXPECT_CONTAINS(unclosed_if, "endif");
  EXPECT_CONTAINS(error_of("{{ x "), "'{{' is never closed: expected '}}'");
  EXPECT_CONTAINS(error_of("{# note"), "never closed with '#}'");
  EXPECT_CONTAINS(error_of("{{ 'abc }}"), "string literal is never closed");
  const std::string filter = error_of("{{ x | frobnicate }}");
  EXPECT_CONTAINS(filter, "line 1, column 8: unknown filter 'frobnicate'");
  EXPECT_CONTAINS(filter, "tojson");  // lists the known ones
  EXPECT_CONTAINS(error_of("{{ x is frob }}"), "unknown test 'frob'");
  EXPECT_CONTAINS(error_of("{% frob %}"), "line 1, column 4: unknown tag 'frob'");
  EXPECT_CONTAINS(error_of("{% for x in y %}{% endif %}"),
                  "unexpected 'endif': expected 'else' or 'endfor' for the 'for' at line 1");
  EXPECT_CONTAINS(error_of("{{ 1 + }}"), "expected an expression, got the end of the expression '}}'");
  EXPECT_CONTAINS(error_of("{{ f(a=1, 2) }}"), "positional argument after a keyword argument");
  EXPECT_CONTAINS(error_of("{{ (1 }}"), "unexpected '}', expected ')'");
  EXPECT_CONTAINS(error_of("{% break %}"), "'{% break %}' outside a for loop");
  EXPECT_CONTAINS(error_of("{{ a ! b }}"), "unexpected character '!'");
  EXPECT_CONTAINS(error_of("{% for x in xs recursive %}{% endfor %}"), "recursive for loops are not supported");
}

TEST(ChatTemplate, RuntimeErrorsNameThePositionAndTheCulprit) {
  EXPECT_CONTAINS(error_of("\n\n  {{ 'a' + 1 }}"), "line 3, column 10: can only concatenate str (not \"int\") to str");
  EXPECT_CONTAINS(error_of("{{ 1 + 2 | string }}"), "unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_CONTAINS(error_of("{{ frob(1) }}"), "unknown function 'frob'");
  EXPECT_CONTAINS(error_of("{{ 'x'.frob() }}"), "'str' object has no method 'frob'");
  EXPECT_CONTAINS(error_of("{{ missing.x }}"), "line 1, column 11: 'missing' is undefined");
  EXPECT_CONTAINS(error_of("{{ d.a.b }}", R"({"d": {}})"), "'dict object' has no attribute 'a'");
  EXPECT_CONTAINS(error_of("{{ missing + 1 }}"), "'missing' is undefined");
  EXPECT_CONTAINS(error_of("{{ 1 < 'a' }}"), "'<' not supported between instances of 'int' and 'str'");
  EXPECT_CONTAINS(error_of("{{ 1 / 0 }}"), "division by zero");
  EXPECT_CONTAINS(error_of("{% for x in 3 %}{% endfor %}"), "'int' object is not iterable");
  EXPECT_CONTAINS(error_of("{% set x = 1 %}{% set x.a = 2 %}"), "cannot set 'x.a': 'x' is a int, not a namespace()");
  EXPECT_CONTAINS(error_of("{{ xs.append(1) }}", R"({"xs": []})"), "list.append() would modify a list");
  EXPECT_CONTAINS(error_of("{{ 'a'.split(1, 2, 3) }}"), "split() takes at most 2 arguments (3 given)");
  EXPECT_CONTAINS(error_of("{{ x | tojson }}"), "Object of type Undefined is not JSON serializable");
  EXPECT_CONTAINS(error_of("{{ 'a' | join(x=1) }}"), "join() got an unexpected keyword argument 'x'");
  EXPECT_CONTAINS(error_of("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"), "recursed more than 100 levels");
  EXPECT_CONTAINS(error_of("{% set a, b = [1] %}"), "cannot unpack 1 values into 2 names");
  EXPECT_CONTAINS(error_of("{{ 1 }}", "[1, 2]"), "the template context must be a JSON object");
}

TEST(ChatTemplate, RaiseExceptionSurfacesTheTemplatesMessage) {
  const ChatTemplate t(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user, got ' "
      "~ messages[0].role) }}{% endif %}ok");
  EXPECT_EQ(t.apply(ordered_json::parse(R"([{"role": "user", "content": "x"}])"), false), "ok");
  try {
    t.apply(ordered_json::parse(R"([{"role": "assistant", "content": "x"}])"), false);
    FAIL() << "no exception";
  } catch (const ChatTemplateRaised& e) {
    EXPECT_STREQ(e.what(), "Conversation must start with user, got assistant");
  }
}

TEST(ChatTemplate, ApplyNormalizesMessagesAsTransformers) {
  const ChatTemplate t(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content is defined }}:{{ m | tojson }};{% endfor %}"
      "{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ enable_thinking }}",
      {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  const ordered_json messages = ordered_json::parse(R"([
      {"role": "assistant", "content": null, "tool_calls": [{"name": "f"}]},
      {"role": "assistant", "content": "a", "reasoning": "r"}])");
  EXPECT_EQ(t.apply(messages, true, {{"enable_thinking", false}}),
            R"(<s>assistant:False:{"role": "assistant", "tool_calls": [{"name": "f"}]};)"
            R"(assistant:True:{"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r", )"
            R"("reasoning_content": "r"};None|None|True|False)");
  EXPECT_THROW(t.apply(ordered_json::array(), false), ConfigError);
  EXPECT_THROW(t.apply(ordered_json::parse(R"(["hi"])"), false), ConfigError);
  EXPECT_THROW(t.apply(messages, false, {{"messages", 1}}), ConfigError);
  // A nlohmann::json context converts (its keys come sorted).
  EXPECT_EQ(ChatTemplate("{{ d | tojson }}").render(nlohmann::json::parse(R"({"d": {"b": 1, "a": 2}})")),
            R"({"a": 2, "b": 1})");
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ChatTemplate, LoadsFromAModelDirectory) {
  const fs::path root = colossus::testing::scratch_dir("chat_template") / "model_dirs";
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");

  const fs::path plain = root / "plain";
  write(plain / "tokenizer_config.json", R"({
      "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
      "eos_token": "</s>", "pad_token": null,
      "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{{ eos_token }}{% endfor %}{{ pad_token is defined }}"})");
  const ChatTemplate t = ChatTemplate::from_model_dir(plain.string());
  EXPECT_EQ(t.apply(messages, false), "<s>[hi]</s>False");
  EXPECT_EQ(t.special_tokens().size(), 2u);

  const fs::path named = root / "named";
  write(named / "tokenizer_config.json", R"({"chat_template": [
      {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default {{ unk_token }}"}]})");
  write(named / "special_tokens_map.json", R"({"unk_token": {"content": "<unk>"}})");
  EXPECT_EQ(ChatTemplate::from_model_dir(named.string()).apply(messages, false), "default <unk>");

  const fs::path jinja_file = root / "jinja_file";
  write(jinja_file / "tokenizer_config.json", R"({"eos_token": "<e>", "chat_template": "old"})");
  write(jinja_file / "chat_template.jinja", "new {{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::from_model_dir(jinja_file.string()).apply(messages, false), "new <e>");

  const auto error_of_dir = [](const fs::path& dir) -> std::string {
    try {
      ChatTemplate::from_model_dir(dir.string());
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  fs::create_directories(root / "empty");
  EXPECT_CONTAINS(error_of_dir(root / "empty"), "neither tokenizer_config.json nor chat_template.jinja exists");
  write(root / "no_template" / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_CONTAINS(error_of_dir(root / "no_template"), "tokenizer_config.json has no chat_template");
  write(root / "no_default" / "tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  EXPECT_CONTAINS(error_of_dir(root / "no_default"), "lists templates (rag) but none is named \"default\"");
  write(root / "broken" / "chat_template.jinja", "{% if %}");
  const std::string broken = error_of_dir(root / "broken");
  EXPECT_CONTAINS(broken, "chat_template.jinja: chat template line 1, column 7: expected an expression");
}

}  // namespace
}  // namespace colossus::data::chat
