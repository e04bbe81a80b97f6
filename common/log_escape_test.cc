// Tests for log escaping: no control byte survives, and the escaped text reads back unambiguously.
#include "common/log_escape.h"

#include <string>

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

TEST(LogEscapeTest, PlainTextIsKept) {
  EXPECT_EQ(EscapeForLog("job job-000042 -> RUNNING: started"),
            "job job-000042 -> RUNNING: started");
  EXPECT_TRUE(IsLogSafe("name=alpha labels={gpu: a100}"));
}

TEST(LogEscapeTest, NewlinesCannotStartAForgedLine) {
  const std::string forged = "bye\nE1130 12:00:00.000000 job_manager.cc:1] FAKE";
  const std::string escaped = EscapeForLog(forged);
  EXPECT_EQ(escaped.find('\n'), std::string::npos);
  EXPECT_EQ(escaped, "bye\\nE1130 12:00:00.000000 job_manager.cc:1] FAKE");
  EXPECT_FALSE(IsLogSafe(forged));
}

TEST(LogEscapeTest, ControlCharactersAndBackslashesAreEscaped) {
  EXPECT_EQ(EscapeForLog("a\rb\tc\x1b[31md\x7f"), "a\\rb\\tc\\x1b[31md\\x7f");
  EXPECT_EQ(EscapeForLog(std::string("nul\0end", 7)), "nul\\x00end");
  // A literal backslash-n in the input stays distinguishable from an escaped newline.
  EXPECT_EQ(EscapeForLog("a\\nb"), "a\\\\nb");
  EXPECT_NE(EscapeForLog("a\\nb"), EscapeForLog("a\nb"));
}

TEST(LogEscapeTest, ValidUtf8IsKeptAndInvalidBytesAreEscaped) {
  EXPECT_EQ(EscapeForLog("gr\xc3\xbc\xc3\x9f"
                         "e \xe2\x82\xac \xf0\x9f\x99\x82"),
            "gr\xc3\xbc\xc3\x9f"
            "e \xe2\x82\xac \xf0\x9f\x99\x82");
  EXPECT_EQ(EscapeForLog("bad \xff\xc3"), "bad \\xff\\xc3");
  // Overlong encoding of '/' and a UTF-16 surrogate.
  EXPECT_EQ(EscapeForLog("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(EscapeForLog("\xed\xa0\x80"), "\\xed\\xa0\\x80");
}

TEST(LogEscapeTest, UnicodeControlsAndLineSeparatorsAreEscaped) {
  // U+0085 (NEL), U+2028 (LINE SEPARATOR), U+2029 (PARAGRAPH SEPARATOR).
  EXPECT_EQ(EscapeForLog("a\xc2\x85"
                         "b"),
            "a\\xc2\\x85b");
  EXPECT_EQ(EscapeForLog("a\xe2\x80\xa8"
                         "b\xe2\x80\xa9"),
            "a\\xe2\\x80\\xa8b\\xe2\\x80\\xa9");
}

TEST(LogEscapeTest, NoControlByteSurvivesAnyByte) {
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<char>(b));
  const std::string escaped = EscapeForLog(every_byte);
  for (char c : escaped) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_FALSE(byte < 0x20 || byte == 0x7f) << "byte " << static_cast<int>(byte);
  }
}

}  // namespace
}  // namespace zeroshard::common
