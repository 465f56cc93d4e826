// read_input (ciuic/files.h): regular files only, a size bound, messages naming the file. A test
// that regresses to a blocking open or an unbounded read is killed by alarm() (and ctest TIMEOUT)
// instead of hanging or filling memory.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <ciuic/error.h>
#include <ciuic/files.h>

namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const std::string d = std::string(CIUIC_TEST_TMP) + "/files/" + name;
  std::error_code ec;
  ciuic::remove_tree(d, ec);
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::string& path, uint64_t max_bytes) {
  try {
    ciuic::read_input(path, "test file", max_bytes);
  } catch (const ciuic::Error& e) {
    return e.what();
  }
  return "(no error)";
}

class ReadInput : public ::testing::Test {
 protected:
  void SetUp() override { ::alarm(20); }  // a hang fails the test instead of blocking ctest
  void TearDown() override { ::alarm(0); }
};

TEST_F(ReadInput, ReadsARegularFileWithinTheBound) {
  const std::string p = temp_dir("ok") + "/a.txt";
  std::ofstream(p, std::ios::binary) << "hello\nworld";
  EXPECT_EQ(ciuic::read_input(p, "test file", 11), "hello\nworld");
  const std::string e = temp_dir("empty") + "/e.txt";
  std::ofstream(e).flush();
  EXPECT_EQ(ciuic::read_input(e, "test file", 0), "");
}

TEST_F(ReadInput, RefusesAFileOverTheBound) {
  const std::string p = temp_dir("big") + "/big.txt";
  std::ofstream(p, std::ios::binary) << std::string(1001, 'x');
  const std::string msg = error_of(p, 1000);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot read test file " + p + ": "), std::string::npos) << msg;
  EXPECT_NE(msg.find("1001 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit of 1000 bytes"), std::string::npos) << msg;
}

TEST_F(ReadInput, RefusesAFifoWithoutBlocking) {
  const std::string p = temp_dir("fifo") + "/pipe";
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const std::string msg = error_of(p, 1 << 20);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a regular file (a FIFO (named pipe))"), std::string::npos) << msg;
}

TEST_F(ReadInput, RefusesDevicesAndFolders) {
  for (const char* dev : {"/dev/zero", "/dev/null", "/dev/urandom"}) {
    const std::string msg = error_of(dev, 1 << 20);
    EXPECT_NE(msg.find(dev), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a regular file (a character device)"), std::string::npos) << msg;
  }
  const std::string d = temp_dir("folder");
  EXPECT_NE(error_of(d, 1 << 20).find("not a regular file (a folder)"), std::string::npos);
}

TEST_F(ReadInput, MissingFileNamesTheFile) {
  const std::string p = temp_dir("missing") + "/none.toml";
  const std::string msg = error_of(p, 100);
  EXPECT_EQ(msg, "cannot read test file " + p + ": No such file or directory");
}

}  // namespace
