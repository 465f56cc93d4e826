// ciuic::Error keeps its message readable whatever it quotes (ciuic/error.h): valid UTF-8 (other
// bytes as \xNN) and lines of at most 1000 bytes (first 700 and last 200 bytes kept). Fuzzing
// found messages quoting raw binary input and megabyte-long --set values (issue 16).
#include <gtest/gtest.h>

#include <string>

#include <ciuic/error.h>

namespace {

TEST(Error, InvalidUtf8IsEscaped) {
  EXPECT_STREQ(ciuic::Error("plain ascii").what(), "plain ascii");
  EXPECT_STREQ(ciuic::Error("caf\xc3\xa9 \xf0\x9f\x98\x80").what(), "caf\xc3\xa9 \xf0\x9f\x98\x80");  // kept
  EXPECT_STREQ(ciuic::Error(std::string("a\xff" "b\xc3(\xed\xa0\x80z", 9)).what(), "a\\xffb\\xc3(\\xed\\xa0\\x80z");
  EXPECT_STREQ(ciuic::Error("overlong \xc0\xaf").what(), "overlong \\xc0\\xaf");
  const ciuic::UsageError u("key `\x80`");
  EXPECT_STREQ(u.what(), "key `\\x80`");
  EXPECT_EQ(u.exit_code(), ciuic::kExitUsage);
}

TEST(Error, LongLinesAreCutInTheMiddle) {
  const std::string head(700, 'h'), middle(5000, 'm'), tail(200, 't');
  const std::string m = ciuic::Error("short line\n" + head + middle + tail + "\nlast").what();
  EXPECT_EQ(m, "short line\n" + head + " ... (5000 bytes cut) ... " + tail + "\nlast");
  const std::string ok(1000, 'x');
  EXPECT_EQ(ciuic::Error(ok).what(), ok);
  // A cut never splits a UTF-8 character.
  std::string wide;
  for (int i = 0; i < 600; ++i) wide += "\xc3\xa9";
  const std::string w = ciuic::Error(wide).what();
  EXPECT_LT(w.size(), 1000u);
  EXPECT_EQ(w.substr(0, 700), wide.substr(0, 700));
  EXPECT_NE(w.find(" ... (300 bytes cut) ... "), std::string::npos) << w;
}

}  // namespace
