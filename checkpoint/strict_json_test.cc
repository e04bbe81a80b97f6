// Tests for the strict JSON parser of safetensors headers: values of every kind, exact integers,
// and the refusals (syntax, duplicate names, bad UTF-8 and surrogates, depth, trailing text).
#include "checkpoint/strict_json.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

void ExpectRefused(absl::string_view text, absl::string_view message) {
  absl::StatusOr<JsonValue> parsed = ParseStrictJson(text);
  ASSERT_FALSE(parsed.ok()) << text;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), message))
      << text << ": " << parsed.status().message();
}

TEST(StrictJsonTest, ParsesEveryKind) {
  absl::StatusOr<JsonValue> parsed = ParseStrictJson(
      " {\"a\": [1, -2, 3.5, 1e3], \"b\": {\"c\": \"d\"}, \"t\": true, \"f\": false, \"n\": "
      "null}\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->kind, JsonValue::Kind::kObject);
  ASSERT_EQ(parsed->keys.size(), 5u);
  EXPECT_EQ(parsed->keys[0], "a");
  const JsonValue& a = parsed->items[0];
  ASSERT_EQ(a.kind, JsonValue::Kind::kArray);
  ASSERT_EQ(a.items.size(), 4u);
  EXPECT_TRUE(a.items[0].is_integer);
  EXPECT_EQ(a.items[0].integer, 1);
  EXPECT_EQ(a.items[1].integer, -2);
  EXPECT_FALSE(a.items[2].is_integer);
  EXPECT_EQ(a.items[2].text, "3.5");
  EXPECT_FALSE(a.items[3].is_integer);
  EXPECT_EQ(parsed->items[1].kind, JsonValue::Kind::kObject);
  EXPECT_EQ(parsed->items[1].items[0].text, "d");
  EXPECT_TRUE(parsed->items[2].boolean);
  EXPECT_FALSE(parsed->items[3].boolean);
  EXPECT_EQ(parsed->items[4].kind, JsonValue::Kind::kNull);
}

TEST(StrictJsonTest, IntegersAreExactOrMarkedNotInteger) {
  absl::StatusOr<JsonValue> max = ParseStrictJson("9223372036854775807");
  ASSERT_TRUE(max.ok());
  EXPECT_TRUE(max->is_integer);
  EXPECT_EQ(max->integer, INT64_MAX);
  absl::StatusOr<JsonValue> over = ParseStrictJson("9223372036854775808");
  ASSERT_TRUE(over.ok());
  EXPECT_FALSE(over->is_integer);
  EXPECT_EQ(over->text, "9223372036854775808");
}

TEST(StrictJsonTest, EscapesAndSurrogatePairsDecodeToUtf8) {
  absl::StatusOr<JsonValue> parsed =
      ParseStrictJson(R"("q\"b\\s\/\b\f\n\r\t \u00e9 \ud83d\ude00 é")");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->text, "q\"b\\s/\b\f\n\r\t \xC3\xA9 \xF0\x9F\x98\x80 \xC3\xA9");
}

TEST(StrictJsonTest, RefusesSyntaxErrors) {
  ExpectRefused("", "JSON at byte 0: unexpected end");
  ExpectRefused("{\"a\":", "JSON at byte 5");
  ExpectRefused("{\"a\":1,}", "expected a member name");
  ExpectRefused("[1 2]", "expected ',' or ']'");
  ExpectRefused("{\"a\" 1}", "expected ':'");
  ExpectRefused("{} x", "unexpected text after the value");
  ExpectRefused("tru", "unexpected character 't'");
  ExpectRefused("01", "number with a leading zero");
  ExpectRefused("-", "bad number");
  ExpectRefused("1.", "bad number");
  ExpectRefused("1e", "bad number");
  ExpectRefused("\"abc", "unterminated string");
  ExpectRefused("\"a\x01\"", "control character in a string");
  ExpectRefused(R"("\x")", "bad escape");
  ExpectRefused(R"("\u12")", "short \\u escape");
  ExpectRefused(R"("\u12g4")", "bad \\u escape");
}

TEST(StrictJsonTest, RefusesDuplicateNamesAtAnyDepth) {
  ExpectRefused(R"({"a":1,"a":2})", "duplicate name \"a\"");
  ExpectRefused(R"({"x":{"b":1,"b":2}})", "duplicate name \"b\"");
  EXPECT_TRUE(ParseStrictJson(R"({"x":{"b":1},"y":{"b":2}})").ok());
}

TEST(StrictJsonTest, RefusesBadUnicode) {
  ExpectRefused(R"("\udc00")", "unpaired low surrogate");
  ExpectRefused(R"("\ud800")", "unpaired high surrogate");
  ExpectRefused(R"("\ud800\u0041")", "unpaired high surrogate");
  ExpectRefused("\"\xC0\xAF\"", "string is not UTF-8");          // overlong '/'
  ExpectRefused("\"\xED\xA0\x80\"", "string is not UTF-8");      // an encoded surrogate
  ExpectRefused("\"\xF4\x90\x80\x80\"", "string is not UTF-8");  // above U+10FFFF
}

TEST(StrictJsonTest, BoundsNesting) {
  EXPECT_TRUE(ParseStrictJson(std::string(65, '[') + std::string(65, ']')).ok());
  ExpectRefused(std::string(66, '[') + std::string(66, ']'), "nested too deeply");
}

TEST(StrictJsonTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF5\x80\x80\x80"));
}

TEST(StrictJsonTest, EncodedStringsParseBack) {
  const std::string text = "a\"b\\c\n\r\t\b\f\x01\x1f \xC3\xA9";
  std::string encoded;
  AppendJsonString(text, &encoded);
  EXPECT_EQ(encoded, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f \xC3\xA9\"");
  absl::StatusOr<JsonValue> parsed = ParseStrictJson(encoded);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->text, text);
}

TEST(StrictJsonTest, KindNames) {
  EXPECT_STREQ(JsonKindName(JsonValue::Kind::kObject), "an object");
  EXPECT_STREQ(JsonKindName(JsonValue::Kind::kNumber), "a number");
}

}  // namespace
}  // namespace zeroshard::checkpoint
