// MetricsLog (report/metrics_log.h): records are written and flushed line by line, and a record
// that cannot be written is an error naming the file and the system's reason — never silently lost.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ciuic/error.h>

#include "../launch/subprocess.h"
#include "report/metrics_log.h"

namespace {

using ciuic::report::MetricsLog;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(MetricsLog, AppendsOneFlushedLinePerRecord) {
  const std::string dir = ciuic::testing::fresh_dir("metrics-lines");
  const std::string path = dir + "/metrics.jsonl";
  MetricsLog log(path);
  log.write({{"step", 1}, {"loss", 2.5}});
  EXPECT_EQ(slurp(path), "{\"loss\":2.5,\"step\":1}\n");  // flushed: readable while the log is open
  log.write({{"event", "end"}});
  EXPECT_EQ(slurp(path), "{\"loss\":2.5,\"step\":1}\n{\"event\":\"end\"}\n");
}

TEST(MetricsLog, EmptyPathWritesNothing) {
  MetricsLog log("");
  EXPECT_NO_THROW(log.write({{"step", 1}}));
}

// A full disk: /dev/full accepts the open and fails every write with ENOSPC. The run used to exit
// 0 with an empty metrics.jsonl.
TEST(MetricsLog, AFullDiskIsAnErrorNamingTheFile) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  MetricsLog log("/dev/full");
  try {
    log.write({{"step", 1}, {"loss", 2.5}});
    FAIL() << "a record written to /dev/full did not fail";
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(e.exit_code(), ciuic::kExitRuntime);
    EXPECT_EQ(std::string(e.what()),
              "cannot write metrics file /dev/full: No space left on device ([log] metrics_file; "
              "free some "
              "space or point it to another file system)");
  }
  // A later record is not silently dropped either.
  EXPECT_THROW(log.write({{"event", "end"}}), ciuic::Error);
}

TEST(MetricsLog, AnUnopenableFileIsAnErrorWithTheReason) {
  const std::string dir = ciuic::testing::fresh_dir("metrics-open");
  try {
    MetricsLog log(dir + "/no/such/folder/metrics.jsonl");
    FAIL() << "opened a file in a missing folder";
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open metrics file " + dir +
                  "/no/such/folder/metrics.jsonl for writing: No such file or directory "
                  "([log] metrics_file)");
  }
}

}  // namespace
