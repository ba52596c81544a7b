#include "tests/data/tokenizer_fixtures.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace colossus::data::testing {

namespace {

TokenizerFixtures make_fixtures() {
  std::string pattern = (std::filesystem::temp_directory_path() / "colossus_tokenizers_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  TokenizerFixtures f;
  f.dir = pattern;
  const std::string command = fmt::format("'{}' '{}' '{}'", COLOSSUS_PYTHON, COLOSSUS_TOKENIZER_FIXTURES, f.dir);
  if (std::system(command.c_str()) != 0) throw std::runtime_error("fixture generation failed: " + command);
  std::ifstream in(f.dir + "/expected.json");
  f.expected = nlohmann::json::parse(in);
  return f;
}

// Removes the directory after the last test.
class CleanupEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!created_) return;
    std::error_code ignored;
    std::filesystem::remove_all(fixtures().dir, ignored);
  }
  static bool created_;
};
bool CleanupEnvironment::created_ = false;

[[maybe_unused]] ::testing::Environment* const cleanup = ::testing::AddGlobalTestEnvironment(new CleanupEnvironment);

}  // namespace

const TokenizerFixtures& fixtures() {
  static const TokenizerFixtures f = [] {
    auto made = make_fixtures();
    CleanupEnvironment::created_ = true;
    return made;
  }();
  return f;
}

const nlohmann::json& TokenizerFixtures::tokenizer(const std::string& name) const {
  for (const auto& entry : expected["tokenizers"]) {
    if (entry["name"] == name) return entry;
  }
  throw std::runtime_error("no fixture tokenizer named " + name);
}

}  // namespace colossus::data::testing
