#include "colossus/launcher/line_prefixer.h"
#include "colossus/launcher/rank_channel.h"

#include <gtest/gtest.h>

#include <vector>

namespace colossus::launcher {
namespace {

struct Captured {
  std::vector<std::string> lines;
  LineSink sink() {
    return [this](std::string_view line) { lines.emplace_back(line); };
  }
};

TEST(LinePrefixer, EmitsWholePrefixedLinesAcrossChunks) {
  Captured out;
  LinePrefixer prefixer("[r3] ", out.sink());
  prefixer.feed("hel");
  EXPECT_TRUE(out.lines.empty());
  prefixer.feed("lo\nwor");
  prefixer.feed("ld\n\nlast");
  ASSERT_EQ(out.lines.size(), 3u);
  EXPECT_EQ(out.lines[0], "[r3] hello\n");
  EXPECT_EQ(out.lines[1], "[r3] world\n");
  EXPECT_EQ(out.lines[2], "[r3] \n");
  prefixer.finish();
  ASSERT_EQ(out.lines.size(), 4u);
  EXPECT_EQ(out.lines[3], "[r3] last\n");
  prefixer.finish();
  EXPECT_EQ(out.lines.size(), 4u);
}

TEST(LinePrefixer, CutsOverlongLines) {
  Captured out;
  LinePrefixer prefixer("> ", out.sink(), 4);
  prefixer.feed("abcdefghij");
  ASSERT_EQ(out.lines.size(), 2u);
  EXPECT_EQ(out.lines[0], "> abcd\n");
  EXPECT_EQ(out.lines[1], "> efgh\n");
  prefixer.feed("\n");
  EXPECT_EQ(out.lines.back(), "> ij\n");
}

TEST(LinePrefixer, EmptyPrefixPassesLinesThrough) {
  Captured out;
  LinePrefixer prefixer("", out.sink());
  prefixer.feed("[r1] a\n[r2] b\n");
  EXPECT_EQ(out.lines, (std::vector<std::string>{"[r1] a\n", "[r2] b\n"}));
}

TEST(RankChannel, FramesSurviveArbitrarySplits) {
  std::string stream = encode_frame(FrameType::Hello, "token 3") + encode_frame(FrameType::Stdout, "a\nb") +
                       encode_frame(FrameType::Status, "") + encode_frame(FrameType::Stderr, std::string(300, 'x'));
  for (size_t step : {1, 2, 7, 1000}) {
    FrameReader reader;
    std::vector<Frame> frames;
    for (size_t at = 0; at < stream.size(); at += step) {
      reader.feed(std::string_view(stream).substr(at, step));
      while (auto frame = reader.next()) frames.push_back(*frame);
    }
    ASSERT_EQ(frames.size(), 4u) << "step " << step;
    EXPECT_EQ(frames[0].type, FrameType::Hello);
    EXPECT_EQ(frames[0].payload, "token 3");
    EXPECT_EQ(frames[1].payload, "a\nb");
    EXPECT_EQ(frames[2].type, FrameType::Status);
    EXPECT_EQ(frames[2].payload, "");
    EXPECT_EQ(frames[3].payload.size(), 300u);
  }
}

TEST(RankChannel, RejectsGarbage) {
  FrameReader reader;
  reader.feed("GET / HTTP/1.1\r\n");
  EXPECT_THROW(reader.next(), std::exception);
  EXPECT_EQ(random_token().size(), 32u);
  EXPECT_NE(random_token(), random_token());
}

}  // namespace
}  // namespace colossus::launcher
