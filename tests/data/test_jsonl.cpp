// Post-training JSONL: each record format (TRL's standard and conversational
// forms, both preference forms), auto detection, the FILE:LINE error of each
// kind of bad line, skipping, file / folder / glob expansion, blank and CRLF
// lines, long lines, UTF-8 passing through, and exact resume from a position.
#include "colossus/core/errors.h"
#include "colossus/data/jsonl_records.h"
#include "colossus/data/jsonl_source.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <stdlib.h>

using namespace colossus::data;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "colossus-jsonl-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  // Writes `bytes` exactly (no newline added) and returns the path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path file = path / name;
    fs::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << bytes;
    return file.string();
  }
  fs::path path;
};

Record parse(const std::string& line, RecordFormat format) { return parse_record(json::parse(line), format); }

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const colossus::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// Every record of a source, read to the end.
std::vector<JsonlRecord> read_all(JsonlSource& source) {
  std::vector<JsonlRecord> records;
  while (auto r = source.next()) records.push_back(std::move(*r));
  return records;
}

// The error reading a one-file source with these bytes gives.
std::string read_error(const std::string& bytes, const std::string& format = "auto") {
  TempDir dir;
  const auto file = dir.write("train.jsonl", bytes);
  std::string error = config_error([&] {
    JsonlSource source(file, {.format = format});
    read_all(source);
  });
  // The path is the temporary folder's; keep it from the file name on.
  const auto at = error.find("train.jsonl");
  return at == std::string::npos ? error : error.substr(at);
}

Message msg(const std::string& role, const std::string& content) { return {role, content}; }

}  // namespace

TEST(JsonlRecords, ChatWithSystemKeyAndTextParts) {
  auto r = parse(R"({"system": "Be brief.", "id": 7, "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]},
      {"role": "assistant", "content": "Hi."},
      {"role": "tool", "content": "42", "name": "calc"}]})",
                 RecordFormat::Chat);
  EXPECT_EQ(r.format, RecordFormat::Chat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0], msg("system", "Be brief."));
  EXPECT_EQ(r.messages[1], msg("user", "Hello, world"));
  EXPECT_EQ(r.messages[2], msg("assistant", "Hi."));
  EXPECT_EQ(r.messages[3], msg("tool", "42"));
}

TEST(JsonlRecords, PromptCompletionStandardAndConversational) {
  auto standard = parse(R"({"prompt": "2 + 2 =", "completion": " 4"})", RecordFormat::PromptCompletion);
  EXPECT_FALSE(standard.prompt.conversational);
  EXPECT_EQ(standard.prompt.text, "2 + 2 =");
  EXPECT_EQ(standard.completion.text, " 4");

  auto conv = parse(R"({"prompt": [{"role": "user", "content": "2 + 2?"}],
                        "completion": [{"role": "assistant", "content": "4"}]})",
                    RecordFormat::PromptCompletion);
  EXPECT_TRUE(conv.prompt.conversational);
  EXPECT_TRUE(conv.completion.conversational);
  EXPECT_EQ(conv.prompt.messages, std::vector<Message>{msg("user", "2 + 2?")});
  EXPECT_EQ(conv.completion.messages, std::vector<Message>{msg("assistant", "4")});

  EXPECT_EQ(config_error([] {
              parse(R"({"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]})",
                    RecordFormat::PromptCompletion);
            }),
            "\"prompt\" is a string but \"completion\" is a list of messages; give both in one form");
}

TEST(JsonlRecords, Text) {
  EXPECT_EQ(parse(R"({"text": "Once upon a time.", "source": "web"})", RecordFormat::Text).text, "Once upon a time.");
}

TEST(JsonlRecords, PreferenceExplicitPrompt) {
  auto standard = parse(R"({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."})",
                        RecordFormat::Preference);
  EXPECT_EQ(standard.prompt.text, "The sky is");
  EXPECT_EQ(standard.chosen.text, " blue.");
  EXPECT_EQ(standard.rejected.text, " green.");

  auto conv = parse(R"({"prompt": [{"role": "user", "content": "Sky colour?"}],
                        "chosen": [{"role": "assistant", "content": "Blue."}],
                        "rejected": [{"role": "assistant", "content": "Green."}]})",
                    RecordFormat::Preference);
  EXPECT_TRUE(conv.prompt.conversational);
  EXPECT_EQ(conv.prompt.messages, std::vector<Message>{msg("user", "Sky colour?")});
  EXPECT_EQ(conv.chosen.messages, std::vector<Message>{msg("assistant", "Blue.")});
  EXPECT_EQ(conv.rejected.messages, std::vector<Message>{msg("assistant", "Green.")});

  // "messages" as the prompt (ColossalChat's context).
  auto ctx = parse(R"({"messages": [{"role": "user", "content": "Hi"}],
                       "chosen": [{"role": "assistant", "content": "Hello!"}],
                       "rejected": [{"role": "assistant", "content": "Go away."}]})",
                   RecordFormat::Preference);
  EXPECT_EQ(ctx.prompt.messages, std::vector<Message>{msg("user", "Hi")});
  EXPECT_EQ(ctx.rejected.messages, std::vector<Message>{msg("assistant", "Go away.")});
}

TEST(JsonlRecords, PreferenceImplicitPromptIsTheSharedPrefix) {
  // TRL's extract_prompt: split where they differ, the space before it going with the answers.
  auto text = parse(R"({"chosen": "The sky is blue.", "rejected": "The sky is green."})", RecordFormat::Preference);
  EXPECT_EQ(text.prompt.text, "The sky is");
  EXPECT_EQ(text.chosen.text, " blue.");
  EXPECT_EQ(text.rejected.text, " green.");

  // Bytes of é (c3 a9) and è (c3 a8) differ in their second byte: the split stays before the character.
  auto utf8 = parse(R"({"chosen": "café au lait", "rejected": "cafè noir"})", RecordFormat::Preference);
  EXPECT_EQ(utf8.prompt.text, "caf");
  EXPECT_EQ(utf8.chosen.text, "é au lait");
  EXPECT_EQ(utf8.rejected.text, "è noir");

  auto conv = parse(R"({"chosen": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                   {"role": "assistant", "content": "good"}],
                        "rejected": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                     {"role": "assistant", "content": "bad"}]})",
                    RecordFormat::Preference);
  EXPECT_TRUE(conv.prompt.conversational);
  EXPECT_EQ(conv.prompt.messages, (std::vector<Message>{msg("system", "S"), msg("user", "Q")}));
  EXPECT_EQ(conv.chosen.messages, std::vector<Message>{msg("assistant", "good")});
  EXPECT_EQ(conv.rejected.messages, std::vector<Message>{msg("assistant", "bad")});

  // A string prompt beside conversational answers is ignored and the prompt extracted, as maybe_extract_prompt does.
  auto mixed = parse(R"({"prompt": "Q",
                         "chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "a"}],
                         "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "b"}]})",
                     RecordFormat::Preference);
  EXPECT_TRUE(mixed.prompt.conversational);
  EXPECT_EQ(mixed.prompt.messages, std::vector<Message>{msg("user", "Q")});

  // Identical answers: TRL's loop ends on the last element, which becomes the answer.
  auto same = parse(R"({"chosen": "abc", "rejected": "abc"})", RecordFormat::Preference);
  EXPECT_EQ(same.prompt.text, "ab");
  EXPECT_EQ(same.chosen.text, "c");
  EXPECT_EQ(same.rejected.text, "c");
}

TEST(JsonlRecords, FormatNames) {
  EXPECT_EQ(parse_record_format("auto"), std::nullopt);
  EXPECT_EQ(parse_record_format("chat"), RecordFormat::Chat);
  EXPECT_EQ(parse_record_format("prompt_completion"), RecordFormat::PromptCompletion);
  EXPECT_EQ(parse_record_format("text"), RecordFormat::Text);
  EXPECT_EQ(parse_record_format("preference"), RecordFormat::Preference);
  EXPECT_EQ(config_error([] { parse_record_format("sharegpt"); }),
            "record format 'sharegpt' is not one of \"auto\", \"chat\", \"prompt_completion\", \"text\", "
            "\"preference\"");
}

TEST(JsonlRecords, DetectFormatFromKeys) {
  EXPECT_EQ(detect_format(json::parse(R"({"messages": [], "id": 1})")), RecordFormat::Chat);
  EXPECT_EQ(detect_format(json::parse(R"({"prompt": "a", "completion": "b"})")), RecordFormat::PromptCompletion);
  EXPECT_EQ(detect_format(json::parse(R"({"text": "a"})")), RecordFormat::Text);
  EXPECT_EQ(detect_format(json::parse(R"({"prompt": "a", "chosen": "b", "rejected": "c"})")), RecordFormat::Preference);
  EXPECT_EQ(detect_format(json::parse(R"({"messages": [], "chosen": [], "rejected": []})")), RecordFormat::Preference);
  EXPECT_EQ(detect_format(json::parse(R"({"chosen": "b", "rejected": "c"})")), RecordFormat::Preference);

  const std::string needs =
      "chat needs \"messages\" (a list of {\"role\", \"content\"}, optional \"system\"); prompt_completion needs "
      "\"prompt\" and \"completion\"; text needs \"text\"; preference needs \"chosen\" and \"rejected\" (optional "
      "\"prompt\" or \"messages\"); set the format explicitly or fix the record";
  EXPECT_EQ(config_error([] { detect_format(json::parse(R"({"messages": [], "text": "a"})")); }),
            "ambiguous record format from keys \"messages\", \"text\": " + needs);
  EXPECT_EQ(config_error([] { detect_format(json::parse(R"({"conversations": [], "id": 3})")); }),
            "cannot tell the record format from keys \"conversations\", \"id\": " + needs);
}

TEST(JsonlSource, EachBadLineSaysFileLineAndWhat) {
  const std::string good = R"({"messages": [{"role": "user", "content": "hi"}]})" "\n";
  // One record per line: the literal is cut here, not the line.
  EXPECT_EQ(read_error(good + good +
                       R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, )"
                       R"({"role": 42, "content": "c"}]})" "\n"),
            "train.jsonl:3: \"messages\"[2].role is 42, expected a string");
  EXPECT_EQ(read_error(good + R"({"messages": [{"role": "bot", "content": "c"}]})"),
            "train.jsonl:2: \"messages\"[0].role is \"bot\", expected one of \"system\", \"user\", \"assistant\", "
            "\"tool\"");
  EXPECT_EQ(read_error(good + R"({"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]})"),
            "train.jsonl:2: \"messages\"[0].content[0].type is \"image\"; only \"text\" parts are read");
  EXPECT_EQ(read_error(good + R"({"messages": [{"role": "user"}]})"),
            "train.jsonl:2: \"messages\"[0] has no \"content\"");
  EXPECT_EQ(read_error(good + R"({"messages": "hi"})"),
            "train.jsonl:2: \"messages\" is \"hi\", expected a list of messages");
  EXPECT_EQ(read_error(good + R"({"messages": [{"role": "user", "content": "x"}], "text": "y"})"),
            "train.jsonl:2: \"text\" does not belong in a chat record (keys found: \"messages\", \"text\"); chat needs "
            "\"messages\" (a list of {\"role\", \"content\"}, optional \"system\")");
  EXPECT_EQ(read_error(good + "[1, 2]\n"), "train.jsonl:2: a record is [1,2], expected a JSON object");
  EXPECT_EQ(read_error(good + "{\"messages\": [\n"),
            "train.jsonl:2: invalid JSON: parse error at line 1, column 15: syntax error while parsing value - "
            "unexpected end of input; expected '[', '{', or a literal");
  EXPECT_EQ(read_error(R"({"prompt": "q", "completion": "a"})" "\n" R"({"prompt": "q"})" "\n"),
            "train.jsonl:2: missing \"completion\"; prompt_completion needs \"prompt\" and \"completion\" (keys found: "
            "\"prompt\")");
  EXPECT_EQ(read_error(R"({"text": "a"})" "\n\n" R"({"text": 5})" "\n"),
            "train.jsonl:3: \"text\" is 5, expected a string");
  EXPECT_EQ(read_error(R"({"chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]})" "\n"),
            "train.jsonl:1: \"chosen\" is a string but \"rejected\" is a list of messages; give both in one form");
  // Auto detection names the first line's keys; a format given explicitly checks every line against it.
  EXPECT_EQ(read_error(R"({"instruction": "a", "output": "b"})" "\n"),
            "train.jsonl:1: cannot tell the record format from keys \"instruction\", \"output\": chat needs "
            "\"messages\" (a list of {\"role\", \"content\"}, optional \"system\"); prompt_completion needs "
            "\"prompt\" and \"completion\"; text needs \"text\"; preference needs \"chosen\" and \"rejected\" "
            "(optional \"prompt\" or \"messages\"); set the format explicitly or fix the record");
  EXPECT_EQ(read_error(R"({"text": "a"})" "\n", "chat"),
            "train.jsonl:1: \"text\" does not belong in a chat record (keys found: \"text\"); chat needs \"messages\" "
            "(a list of {\"role\", \"content\"}, optional \"system\")");
  // A long bad value is cut short in the message.
  const std::string long_role(200, 'x');
  EXPECT_EQ(read_error(R"({"messages": [{"role": ")" + long_role + R"(", "content": "c"}]})"),
            "train.jsonl:1: \"messages\"[0].role is \"" + std::string(59, 'x') +
                "..., expected one of \"system\", \"user\", \"assistant\", \"tool\"");
  EXPECT_EQ(read_error(R"({"messages": [{"role": "user", "content": {"k": ")" + long_role + R"("}}]})"),
            "train.jsonl:1: \"messages\"[0].content is {\"k\":\"" + std::string(54, 'x') +
                "..., expected a string or a list of {\"type\": \"text\", \"text\": ...} parts");
}

TEST(JsonlSource, SkipBadLinesCountsAndKeepsTheFirstReasons) {
  TempDir dir;
  const auto file = dir.write("train.jsonl", R"({"text": "one"})" "\n"
                                             "not json\n"
                                             R"({"text": 2})" "\n"
                                             R"({"text": "two"})" "\n"
                                             R"({"txt": "typo"})" "\n"
                                             R"({"text": "three"})" "\n");
  JsonlSource source(file, {.skip_bad_lines = true, .kept_reasons = 2});
  EXPECT_EQ(source.format(), RecordFormat::Text);
  auto records = read_all(source);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].record.text, "one");
  EXPECT_EQ(records[1].record.text, "two");
  EXPECT_EQ(records[1].line_number, 4);
  EXPECT_EQ(records[2].record.text, "three");
  EXPECT_EQ(records[2].line_number, 6);
  EXPECT_EQ(source.skipped(), 3);
  ASSERT_EQ(source.skip_reasons().size(), 2u);
  EXPECT_EQ(source.skip_reasons()[0].substr(0, file.size() + 18), file + ":2: invalid JSON: ");
  EXPECT_EQ(source.skip_reasons()[1], file + ":3: \"text\" is 2, expected a string");
  EXPECT_EQ(source.skip_summary(),
            "skipped 3 bad lines; first: " + source.skip_reasons()[0] + "; " + source.skip_reasons()[1]);

  // Without skipping the first bad line stops the read.
  JsonlSource strict(file);
  ASSERT_TRUE(strict.next().has_value());
  EXPECT_THROW(strict.next(), colossus::ConfigError);

  // Auto detection passes over leading lines it cannot read when skipping.
  const auto leading = dir.write("leading.jsonl", "garbage\n[]\n" R"({"prompt": "p", "completion": "c"})" "\n");
  JsonlSource skipping(leading, {.skip_bad_lines = true});
  EXPECT_EQ(skipping.format(), RecordFormat::PromptCompletion);
  auto rest = read_all(skipping);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].line_number, 3);
  EXPECT_EQ(skipping.skipped(), 2);
}

TEST(JsonlSource, FolderAndGlobExpandInNameOrder) {
  TempDir dir;
  dir.write("data/b.jsonl", R"({"text": "b"})" "\n");
  dir.write("data/a.jsonl", R"({"text": "a1"})" "\n" R"({"text": "a2"})" "\n");
  dir.write("data/C.jsonl", R"({"text": "C"})" "\n");  // upper case sorts first in byte order
  dir.write("data/notes.txt", "not a dataset\n");
  dir.write("data/sub/d.jsonl", R"({"text": "nested"})" "\n");
  const auto data = (dir.path / "data").string();

  JsonlSource folder(data);
  EXPECT_EQ(folder.files(), (std::vector<std::string>{data + "/C.jsonl", data + "/a.jsonl", data + "/b.jsonl"}));
  auto records = read_all(folder);
  ASSERT_EQ(records.size(), 4u);
  std::vector<std::string> texts;
  std::vector<int64_t> files;
  for (const auto& r : records) {
    texts.push_back(r.record.text);
    files.push_back(r.file_index);
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"C", "a1", "a2", "b"}));
  EXPECT_EQ(files, (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(records[2].line_number, 2);

  dir.write("shards/part-10.jsonl", R"({"text": "10"})" "\n");
  dir.write("shards/part-02.jsonl", R"({"text": "02"})" "\n");
  dir.write("shards/other-01.jsonl", R"({"text": "other"})" "\n");
  const auto shards = (dir.path / "shards").string();
  JsonlSource glob(shards + "/part-*.jsonl");
  EXPECT_EQ(glob.files(), (std::vector<std::string>{shards + "/part-02.jsonl", shards + "/part-10.jsonl"}));
  auto globbed = read_all(glob);
  ASSERT_EQ(globbed.size(), 2u);
  EXPECT_EQ(globbed[0].record.text, "02");
  EXPECT_EQ(globbed[1].record.text, "10");

  EXPECT_EQ(config_error([&] { JsonlSource(shards + "/eval-*.jsonl"); }),
            "JSONL source '" + shards + "/eval-*.jsonl' matches no files");
  dir.write("empty/readme.md", "x");
  EXPECT_EQ(config_error([&] { JsonlSource((dir.path / "empty").string()); }),
            "JSONL source '" + (dir.path / "empty").string() + "' is a folder with no *.jsonl files");
  EXPECT_EQ(config_error([&] { JsonlSource((dir.path / "missing.jsonl").string()); }),
            "JSONL source '" + (dir.path / "missing.jsonl").string() +
                "' does not exist; give a .jsonl file, a folder of *.jsonl files or a glob such as 'data/*.jsonl'");
}

TEST(JsonlSource, BlankLinesCrlfLongLinesAndUtf8) {
  TempDir dir;
  const std::string long_text(1536 * 1024, 'z');  // 1.5 MB in one line
  const std::string utf8 = "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82";  // héllo 世界 🙂
  const auto file = dir.write("mixed.jsonl", "\n   \r\n"                                            // lines 1, 2
                                             R"({"text": "crlf"})" "\r\n"                           // 3
                                             "\t\n"                                                 // 4
                                             R"({"text": ")" + long_text + R"("})" "\n"             // 5
                                             R"({"text": ")" + utf8 + R"("})" "\r\n"                // 6
                                             R"({"text": "\u00e9\ud83d\ude42"})" "\n"               // 7
                                             R"({"text": "last line without a newline"})");         // 8
  JsonlSource source(file);
  std::vector<JsonlRecord> records;
  for (int i = 0; i < 5; ++i) {
    auto r = source.next();
    ASSERT_TRUE(r.has_value()) << i;
    records.push_back(std::move(*r));
  }
  // After the last record the position is the end of the file; after the end, past the last file.
  EXPECT_EQ(source.position().byte_offset, static_cast<int64_t>(fs::file_size(file)));
  EXPECT_EQ(source.position().line_number, 8);
  EXPECT_FALSE(source.next().has_value());
  EXPECT_EQ(source.position().file_index, 1);
  EXPECT_EQ(records[0].record.text, "crlf");
  EXPECT_EQ(records[0].line_number, 3);
  EXPECT_EQ(records[1].record.text, long_text);
  EXPECT_EQ(records[1].line_number, 5);
  EXPECT_EQ(records[2].record.text, utf8);
  EXPECT_EQ(records[2].line_number, 6);
  EXPECT_EQ(records[3].record.text, "\xC3\xA9\xF0\x9F\x99\x82");  // escapes decode to the same UTF-8
  EXPECT_EQ(records[4].record.text, "last line without a newline");
  EXPECT_EQ(records[4].line_number, 8);

  // Bytes that are not UTF-8 inside a string are a bad line, not passed through.
  EXPECT_EQ(read_error(R"({"text": ")" "\xFF" R"("})" "\n").substr(0, 45),
            "train.jsonl:1: invalid JSON: parse error at l");
}

TEST(JsonlSource, ResumesAtExactlyTheNextRecord) {
  TempDir dir;
  dir.write("r/0.jsonl", R"({"text": "a"})" "\r\n\n" R"({"text": "b"})" "\n" "bad\n" R"({"text": "c"})" "\n");
  dir.write("r/1.jsonl", "\n");  // a file with no records
  dir.write("r/2.jsonl", R"({"text": "d"})" "\n" R"({"text": 1})" "\n" R"({"text": "e"})");
  const auto source_dir = (dir.path / "r").string();
  const JsonlSourceOptions options{.skip_bad_lines = true};

  JsonlSource whole(source_dir, options);
  const auto expected = read_all(whole);
  ASSERT_EQ(expected.size(), 5u);
  EXPECT_EQ(whole.skipped(), 2);

  for (size_t n = 0; n <= expected.size(); ++n) {
    JsonlSource first(source_dir, options);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(first.next().has_value());
    const JsonlPosition saved = first.position();
    EXPECT_EQ(saved.records_yielded, static_cast<int64_t>(n));
    // Through its serialised form, as a checkpoint would keep it.
    const auto restored = JsonlPosition::from_json(json::parse(saved.to_json().dump()));
    EXPECT_EQ(restored, saved);

    JsonlSource resumed(source_dir, options);
    resumed.seek(restored);
    auto rest = read_all(resumed);
    ASSERT_EQ(rest.size(), expected.size() - n) << "after " << n;
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].record.text, expected[n + i].record.text) << "after " << n;
      EXPECT_EQ(rest[i].file_index, expected[n + i].file_index);
      EXPECT_EQ(rest[i].line_number, expected[n + i].line_number);
    }
    EXPECT_EQ(resumed.position().records_yielded, 5);
    EXPECT_EQ(resumed.skipped(), 2) << "after " << n;
  }

  // A position from another file list is refused rather than resumed at a wrong place.
  JsonlSource first(source_dir, options);
  first.next();
  auto moved = first.position();
  moved.file = source_dir + "/renamed.jsonl";
  JsonlSource other(source_dir, options);
  EXPECT_EQ(config_error([&] { other.seek(moved); }),
            "JSONL position was taken in '" + moved.file + "' but file 0 of the source is now '" + source_dir +
                "/0.jsonl'; the dataset's files changed since");
  auto too_far = first.position();
  too_far.byte_offset = 1000;
  EXPECT_NE(config_error([&] { other.seek(too_far); }).find("JSONL position byte 1000 is outside"), std::string::npos);
}
