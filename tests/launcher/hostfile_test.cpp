#include "colossus/launcher/hostfile.h"
#include "colossus/core/errors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace colossus::launcher {
namespace {

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Hostfile, ParsesAllFormsCommentsAndBlankLines) {
  auto hosts = parse_hostfile_text(
      "# cluster\n"
      "\n"
      "node-a slots=4\n"
      "  node-b:8   # trailing comment\n"
      "node-c\n"
      "10.0.0.7 slots=2\n",
      "hosts.txt");
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0].name, "node-a");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[0].line, 3);
  EXPECT_EQ(hosts[1].name, "node-b");
  EXPECT_EQ(hosts[1].slots, 8);
  EXPECT_EQ(hosts[2].name, "node-c");
  EXPECT_FALSE(hosts[2].slots.has_value());
  EXPECT_EQ(hosts[3].name, "10.0.0.7");
  EXPECT_EQ(hosts[3].line, 6);
}

TEST(Hostfile, ErrorsNameFileLineAndValue) {
  EXPECT_EQ(error_of([] { parse_hostfile_text("a\nb slot=4\n", "hf"); }),
            "hf:2: cannot parse 'b slot=4'; expected 'hostname', 'hostname slots=N' or 'hostname:N'");
  EXPECT_EQ(error_of([] { parse_hostfile_text("a slots=0\n", "hf"); }),
            "hf:1: bad slot count '0' for host 'a'; expected a positive integer");
  EXPECT_EQ(error_of([] { parse_hostfile_text("a:x\n", "hf"); }),
            "hf:1: bad slot count 'x' for host 'a'; expected a positive integer");
  EXPECT_EQ(error_of([] { parse_hostfile_text("a slots=-2\n", "hf"); }),
            "hf:1: bad slot count '-2' for host 'a'; expected a positive integer");
  EXPECT_EQ(error_of([] { parse_hostfile_text("a:2 slots=3\n", "hf"); }),
            "hf:1: cannot parse 'a:2 slots=3'; expected 'hostname', 'hostname slots=N' or 'hostname:N'");
  EXPECT_EQ(error_of([] { parse_hostfile_text("a b c\n", "hf"); }),
            "hf:1: cannot parse 'a b c'; expected 'hostname', 'hostname slots=N' or 'hostname:N'");
  EXPECT_EQ(error_of([] { parse_hostfile_text("a\n\na:2\n", "hf"); }),
            "hf:3: host 'a' is listed twice (first on line 1)");
  EXPECT_EQ(error_of([] { parse_hostfile_text("# nothing\n\n", "hf"); }), "hostfile 'hf' lists no hosts");
}

TEST(Hostfile, MissingFileIsNamed) {
  EXPECT_EQ(error_of([] { parse_hostfile("/nonexistent/hosts"); }),
            "hostfile '/nonexistent/hosts' cannot be read: No such file or directory");
}

TEST(Hostfile, ReadsAFile) {
  std::string path = ::testing::TempDir() + "/launcher_hostfile_test.txt";
  std::ofstream(path) << "alpha slots=2\nbeta:2\n";
  auto hosts = parse_hostfile(path);
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[1].name, "beta");
  std::remove(path.c_str());
}

TEST(Hostfile, IncludeAndExcludeKeepHostfileOrder) {
  auto hosts = parse_hostfile_text("a\nb\nc\nd\n", "hf");
  auto names = [](const std::vector<Host>& list) {
    std::string joined;
    for (const auto& host : list) joined += host.name;
    return joined;
  };
  EXPECT_EQ(names(select_hosts(hosts, {}, {}, "hf")), "abcd");
  EXPECT_EQ(names(select_hosts(hosts, {"d", "b"}, {}, "hf")), "bd");
  EXPECT_EQ(names(select_hosts(hosts, {}, {"a", "c"}, "hf")), "bd");
  EXPECT_EQ(names(select_hosts(hosts, {"a", "b"}, {"a"}, "hf")), "b");
  EXPECT_EQ(split_host_list(" a, b,,c "), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(Hostfile, SelectionErrors) {
  auto hosts = parse_hostfile_text("a\nb\n", "hf");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, {"z"}, {}, "hf"); }),
            "--include names host 'z', which hostfile 'hf' does not list (it lists: a, b)");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, {}, {"y"}, "hf"); }),
            "--exclude names host 'y', which hostfile 'hf' does not list (it lists: a, b)");
  EXPECT_EQ(error_of([&] {
              select_hosts(hosts, {}, {"a", "b"}, "hf");
            }),
            "no hosts left after --include/--exclude (hostfile 'hf' lists: a, b)");
}

TEST(Hostfile, SlotsMustHoldTheRanksPerNode) {
  auto hosts = parse_hostfile_text("a slots=8\nb:2\nc\n", "hf");
  EXPECT_NO_THROW(check_slots(hosts, 2, "hf"));
  EXPECT_EQ(error_of([&] { check_slots(hosts, 4, "hf"); }),
            "host 'b' has slots=2 (hf:2) but --nproc_per_node is 4; lower --nproc_per_node or raise the slots");
}

TEST(Hostfile, MpiHostfileGivesEveryHostTheRanksPerNode) {
  auto hosts = parse_hostfile_text("a slots=8\nb\n", "hf");
  EXPECT_EQ(mpi_hostfile_text(hosts, 4), "a slots=4\nb slots=4\n");
}

}  // namespace
}  // namespace colossus::launcher
