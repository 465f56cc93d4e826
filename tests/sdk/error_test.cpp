// ciuic::Error keeps its message readable whatever it quotes (ciuic/error.h): valid UTF-8 (other
// bytes as \xNN) and lines of at most 1000 bytes (first 700 and last 200 bytes kept). Fuzzing
// found messages quoting raw binary input and megabyte-long --set values (issue 16).
#include <gtest/gtest.h>

#include <string>

#include <toml++/toml.h>

#include <ciuic/error.h>
#include <ciuic/log.h>

#include "sdk/printable.h"
#include "sdk/toml_format.h"

namespace {

TEST(Error, InvalidUtf8IsEscaped) {
  EXPECT_STREQ(ciuic::Error("plain ascii").what(), "plain ascii");
  EXPECT_STREQ(ciuic::Error("caf\xc3\xa9 \xf0\x9f\x98\x80").what(),
               "caf\xc3\xa9 \xf0\x9f\x98\x80");  // kept
  EXPECT_STREQ(ciuic::Error(std::string("a\xff"
                                        "b\xc3(\xed\xa0\x80z",
                                        9))
                   .what(),
               "a\\xffb\\xc3(\\xed\\xa0\\x80z");
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

// Issue 27: a message quoting a config cannot send a terminal escape sequence, and a NUL in it
// does not end it. \n and \t of a message are kept; every other control byte is shown as \xNN.
TEST(Error, ControlBytesAreShownNotSent) {
  EXPECT_STREQ(ciuic::Error("key \x1b]0;title\x07\x1b[2J: bad").what(),
               "key \\x1b]0;title\\x07\\x1b[2J: bad");
  EXPECT_EQ(std::string(ciuic::Error(std::string("before\0after", 12)).what()), "before\\x00after");
  EXPECT_STREQ(ciuic::Error("two\nlines\tand a tab\r, a CR, DEL\x7f").what(),
               "two\nlines\tand a tab\\x0d, a CR, DEL\\x7f");
  // C1 controls (U+009B is CSI to some terminals), line separators, bidi overrides: \uXXXX.
  EXPECT_STREQ(ciuic::Error("csi \xc2\x9b"
                            "2J nel \xc2\x85 ls \xe2\x80\xa8 rlo \xe2\x80\xae lri \xe2\x81\xa6")
                   .what(),
               "csi \\u009b2J nel \\u0085 ls \\u2028 rlo \\u202e lri \\u2066");
  // Text that needs nothing comes back as it is; escaping twice changes nothing.
  const std::string clean = "caf\xc3\xa9 \xe2\x82\xac \\x1b stays";
  EXPECT_EQ(ciuic::printable_text(clean), clean);
  const std::string once = ciuic::printable_text("a\x1b\xff\n\xc2\x9b");
  EXPECT_EQ(ciuic::printable_text(once), once);
  EXPECT_EQ(ciuic::printable_text("a\nb\tc", /*keep_lines=*/false), "a\\x0ab\\x09c");
}

TEST(Error, LogLinesShowControlBytes) {
  testing::internal::CaptureStderr();
  std::string m = "file says \x1b[31mred\x07 and ";
  m += '\0';
  m += " nul";
  ciuic::log_warn(m);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "ciuic warning: file says \\x1b[31mred\\x07 and \\x00 nul\n");
}

// toml_quote holds any text exactly (toml++ reads back what was quoted) and shows nothing a
// terminal acts on; toml_comment cannot end its line. toml++ is the reference.
TEST(Error, TomlQuoteAndCommentHoldAnyText) {
  std::string every;  // every code point class: all ASCII, C1, separators, bidi, 4-byte
  for (int c = 0; c < 0x80; ++c) every += static_cast<char>(c);
  every +=
      "\xc2\x80\xc2\x9b\xc2\x9f\xc2\xa0\xe2\x80\xa8\xe2\x80\xa9\xe2\x80\xaa\xe2\x80\xae\xe2\x81\xa6"
      "\xe2\x81\xa9\xf0\x9f\x98\x80";
  const std::string quoted = ciuic::toml_quote(every);
  for (unsigned char c : quoted) EXPECT_TRUE(c >= 0x20 && c != 0x7f) << static_cast<int>(c);
  EXPECT_EQ(quoted.find("\xc2\x9b"), std::string::npos);
  const toml::table t = toml::parse("k = " + quoted + "\n" +
                                    ciuic::toml_comment(every + "\n[run]\nx = 1") + "\nj = 2\n");
  EXPECT_EQ(t["k"].value<std::string>().value_or("<none>"), every);
  EXPECT_EQ(t.size(), 2u) << "the comment ended early";
  EXPECT_EQ(t["j"].value<int64_t>().value_or(0), 2);
  // A byte that is not UTF-8 cannot be in a TOML string: U+FFFD stands for it, and the file parses.
  EXPECT_EQ(toml::parse("k = " +
                        ciuic::toml_quote("a\xff"
                                          "b") +
                        "\n")["k"]
                .value<std::string>()
                .value_or(""),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(ciuic::toml_key("plain_key-1"), "plain_key-1");
  EXPECT_EQ(ciuic::toml_key("a.b]\n"), "\"a.b]\\n\"");
}

}  // namespace
