// Tests for the safetensors container: the exact byte layout, streaming round trips, the
// header validation's refusals, and a full disk.
#include "checkpoint/safetensors.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

std::string MakeTestDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(n, '\0');
  for (char& b : bytes) b = static_cast<char>(rng());
  return bytes;
}

std::string LittleEndian64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return bytes;
}

// A file of the given header (unpadded: readers must accept any length) and data.
std::string WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
  EXPECT_TRUE(WriteFileDurably(path, LittleEndian64(header.size()) + header + data).ok());
  return path;
}

absl::StatusOr<WrittenFile> WriteAll(const std::string& path, std::vector<TensorDecl> tensors,
                                     const SafetensorsMetadata& metadata, const std::string& data) {
  auto writer = SafetensorsWriter::Create(path, std::move(tensors), metadata);
  if (!writer.ok()) return writer.status();
  absl::Status appended = (*writer)->Append(data.data(), data.size());
  if (!appended.ok()) return appended;
  return (*writer)->Finish();
}

TEST(SafetensorsTest, DTypeNamesAndSizes) {
  EXPECT_EQ(SafetensorsDTypeName(SafetensorsDType::kBF16), "BF16");
  EXPECT_EQ(SafetensorsDTypeSize(SafetensorsDType::kBF16), 2);
  EXPECT_EQ(SafetensorsDTypeSize(SafetensorsDType::kF64), 8);
  EXPECT_EQ(*ParseSafetensorsDType("F8_E4M3"), SafetensorsDType::kF8E4M3);
  EXPECT_EQ(ParseSafetensorsDType("F4").status().code(), absl::StatusCode::kInvalidArgument);
}

// The layout the official library expects, byte for byte: u64 LE length, the JSON header
// padded with spaces to a multiple of 8, then the tensors back to back in offset order.
TEST(SafetensorsTest, GoldenLayout) {
  const std::string path = MakeTestDir("golden") + "/g.safetensors";
  const std::string a = RandomBytes(2 * 3 * 4, 1);
  const std::string b = RandomBytes(5 * 2, 2);
  absl::StatusOr<WrittenFile> written =
      WriteAll(path, {{"a", SafetensorsDType::kF32, {2, 3}}, {"b.x", SafetensorsDType::kBF16, {5}}},
               {{"format", "pt1"}, {"note", "say \"hi\"\n"}}, a + b);
  ASSERT_TRUE(written.ok()) << written.status();

  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt1\",\"note\":\"say \\\"hi\\\"\\n\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"b.x\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[24,34]}}";
  const size_t padded = (header.size() + 7) / 8 * 8;
  ASSERT_GT(padded, header.size());  // this header does need padding
  const std::string expected =
      LittleEndian64(padded) + header + std::string(padded - header.size(), ' ') + a + b;
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(*contents, expected);
  EXPECT_EQ(written->bytes, expected.size());
  EXPECT_EQ(written->crc32c, Crc32c(expected.data(), expected.size()));
  EXPECT_EQ(written->path, path);
}

// The head a streaming producer sends is the writer's, byte for byte.
TEST(SafetensorsTest, EncodedHeadIsWhatTheWriterWrites) {
  const std::string path = MakeTestDir("head") + "/h.safetensors";
  const std::vector<TensorDecl> tensors = {{"w", SafetensorsDType::kF32, {3, 5}},
                                           {"b", SafetensorsDType::kF16, {7}}};
  const SafetensorsMetadata metadata = {{"format", "pt"}};
  absl::StatusOr<SafetensorsHead> head = EncodeSafetensorsHead(tensors, metadata);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->tensor_bytes, (std::vector<uint64_t>{60, 14}));
  EXPECT_EQ(head->data_bytes, 74u);
  EXPECT_EQ(head->bytes.size() % 8, 0u);
  const std::string data = RandomBytes(74, 3);
  ASSERT_TRUE(WriteAll(path, tensors, metadata, data).ok());
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(*contents, head->bytes + data);

  absl::Status refused =
      EncodeSafetensorsHead({{"w", SafetensorsDType::kF32, {-1}}}, metadata).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.message(), "negative dimension")) << refused;
}

TEST(SafetensorsTest, ChunkedStreamRoundTrips) {
  const std::string path = MakeTestDir("roundtrip") + "/r.safetensors";
  std::vector<TensorDecl> tensors = {{"first", SafetensorsDType::kF32, {1000}},
                                     {"empty", SafetensorsDType::kF32, {0, 7}},
                                     {"second", SafetensorsDType::kF16, {33, 3}},
                                     {"scalar", SafetensorsDType::kI64, {}},
                                     {"\xc3\xa4 \"quoted\"\\", SafetensorsDType::kU8, {17}}};
  const std::vector<size_t> sizes = {4000, 0, 198, 8, 17};
  std::string data;
  for (size_t i = 0; i < sizes.size(); ++i) data += RandomBytes(sizes[i], 10 + i);

  auto writer = SafetensorsWriter::Create(path, tensors, {{"k", "v"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->data_bytes(), data.size());
  std::mt19937 rng(4);
  size_t at = 0;
  while (at < data.size()) {
    const size_t chunk = std::min<size_t>(data.size() - at, rng() % 300);
    ASSERT_TRUE((*writer)->Append(data.data() + at, chunk).ok());
    at += chunk;
  }
  size_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ((*writer)->tensor_crc32c(i), Crc32c(data.data() + offset, sizes[i])) << i;
    offset += sizes[i];
  }
  absl::StatusOr<WrittenFile> written = (*writer)->Finish();
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(written->crc32c, Crc32c(contents->data(), contents->size()));
  EXPECT_EQ(written->bytes, contents->size());

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->file_size(), contents->size());
  EXPECT_EQ((*reader)->data_start() % 8, 0u);
  EXPECT_EQ((*reader)->metadata(), (SafetensorsMetadata{{"k", "v"}}));
  ASSERT_EQ((*reader)->tensors().size(), tensors.size());
  offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo* info = (*reader)->Find(tensors[i].name);
    ASSERT_NE(info, nullptr) << tensors[i].name;
    EXPECT_EQ(info->dtype, tensors[i].dtype);
    EXPECT_EQ(info->shape, tensors[i].shape);
    EXPECT_EQ(info->data_begin, offset);
    EXPECT_EQ(info->num_bytes(), sizes[i]);
    std::string bytes(sizes[i], '\0');
    ASSERT_TRUE((*reader)->ReadTensorBytes(*info, 0, bytes.data(), bytes.size()).ok());
    EXPECT_EQ(bytes, data.substr(offset, sizes[i])) << tensors[i].name;
    offset += sizes[i];
  }
  // A part of one tensor.
  const TensorInfo* first = (*reader)->Find("first");
  std::string part(100, '\0');
  ASSERT_TRUE((*reader)->ReadTensorBytes(*first, 3900, part.data(), part.size()).ok());
  EXPECT_EQ(part, data.substr(3900, 100));
  EXPECT_EQ((*reader)->ReadTensorBytes(*first, 3950, part.data(), part.size()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->Find("absent"), nullptr);
}

TEST(SafetensorsTest, WriterRefusesBadDeclarations) {
  const std::string dir = MakeTestDir("bad_decls");
  const std::string path = dir + "/x.safetensors";
  auto code_and_message = [&](std::vector<TensorDecl> tensors, SafetensorsMetadata metadata) {
    absl::Status status = SafetensorsWriter::Create(path, std::move(tensors), metadata).status();
    return std::make_pair(status.code(), std::string(status.message()));
  };
  auto [code, message] = code_and_message(
      {{"a", SafetensorsDType::kF32, {1}}, {"a", SafetensorsDType::kF32, {1}}}, {});
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(message, "tensors[1] \"a\": duplicate name")) << message;
  std::tie(code, message) = code_and_message({{"", SafetensorsDType::kF32, {1}}}, {});
  EXPECT_TRUE(absl::StrContains(message, "tensors[0]: empty name")) << message;
  std::tie(code, message) = code_and_message({{"__metadata__", SafetensorsDType::kF32, {1}}}, {});
  EXPECT_TRUE(absl::StrContains(message, "reserved")) << message;
  std::tie(code, message) = code_and_message({{"n", SafetensorsDType::kF32, {2, -1}}}, {});
  EXPECT_TRUE(absl::StrContains(message, "negative dimension -1")) << message;
  std::tie(code, message) = code_and_message({{"bad\xff", SafetensorsDType::kF32, {1}}}, {});
  EXPECT_TRUE(absl::StrContains(message, "not valid UTF-8")) << message;
  std::tie(code, message) =
      code_and_message({{"n", SafetensorsDType::kF32, {int64_t{1} << 62, 8}}}, {});
  EXPECT_TRUE(absl::StrContains(message, "overflows")) << message;
  std::tie(code, message) = code_and_message({}, {{"k", "\xed\xa0\x80"}});  // a surrogate
  EXPECT_TRUE(absl::StrContains(message, "metadata \"k\"")) << message;
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(SafetensorsTest, IncompleteDataIsRefusedAndLeavesNoFile) {
  const std::string dir = MakeTestDir("incomplete");
  const std::string path = dir + "/x.safetensors";
  {
    auto writer = SafetensorsWriter::Create(
        path, {{"a", SafetensorsDType::kF32, {4}}, {"b", SafetensorsDType::kF32, {4}}}, {});
    ASSERT_TRUE(writer.ok());
    const std::string data(20, 'x');
    ASSERT_TRUE((*writer)->Append(data.data(), data.size()).ok());
    const absl::Status overrun = (*writer)->Append(data.data(), data.size());
    EXPECT_EQ(overrun.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(overrun.message(), "overruns the 32 bytes")) << overrun;
    const absl::Status finished = (*writer)->Finish().status();
    EXPECT_EQ(finished.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(finished.message(), "tensor \"b\" has 4 of its 16 bytes"))
        << finished;
  }
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(SafetensorsTest, MetadataReplacedAtFinishMustFitTheReservedHeader) {
  const std::string path = MakeTestDir("setmeta") + "/m.safetensors";
  auto writer =
      SafetensorsWriter::Create(path, {{"a", SafetensorsDType::kU8, {3}}}, {{"crc", "4294967295"}});
  ASSERT_TRUE(writer.ok());
  // Eight more bytes than the placeholder cannot fit in its padding (at most seven spaces).
  const absl::Status longer = (*writer)->SetMetadata({{"crc", "429496729500000000"}});
  EXPECT_EQ(longer.code(), absl::StatusCode::kFailedPrecondition) << longer;
  ASSERT_TRUE((*writer)->SetMetadata({{"crc", "7"}}).ok());
  ASSERT_TRUE((*writer)->Append("abc", 3).ok());
  absl::StatusOr<WrittenFile> written = (*writer)->Finish();
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  EXPECT_EQ(written->crc32c, Crc32c(contents->data(), contents->size()));
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata().at("crc"), "7");
  EXPECT_EQ(contents->substr(contents->size() - 3), "abc");
}

// Runs `body` in a forked child whose files may not grow past `limit` bytes, with SIGXFSZ
// ignored so that writes fail with EFBIG as on a full disk; returns what `body` returned.
std::string RunWithFileSizeLimit(rlim_t limit, const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit rl = {limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    const std::string result = body();
    if (::write(fds[1], result.data(), result.size()) < 0) ::_exit(2);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string result;
  char chunk[512];
  ssize_t n;
  while ((n = ::read(fds[0], chunk, sizeof(chunk))) > 0) result.append(chunk, n);
  ::close(fds[0]);
  int wait_status = 0;
  ::waitpid(pid, &wait_status, 0);
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  return result;
}

TEST(SafetensorsTest, FullDiskIsAClearErrorAndLeavesNoFile) {
  const std::string dir = MakeTestDir("full_disk");
  const std::string path = dir + "/rank.safetensors";
  const std::string result = RunWithFileSizeLimit(64 << 10, [&]() -> std::string {
    auto writer = SafetensorsWriter::Create(path, {{"big", SafetensorsDType::kF32, {1 << 20}}}, {});
    if (!writer.ok()) return "create: " + writer.status().ToString();
    const std::string chunk(1 << 16, 'z');
    for (int i = 0; i < 64; ++i) {
      absl::Status status = (*writer)->Append(chunk.data(), chunk.size());
      if (!status.ok()) return status.ToString();
    }
    return (*writer)->Finish().status().ToString();
  });
  EXPECT_TRUE(absl::StrContains(result, "File too large")) << result;
  EXPECT_TRUE(absl::StrContains(result, dir + "/.rank.safetensors.tmp-")) << result;
  EXPECT_TRUE(ListDir(dir).empty());
}

// ---- The reader's refusals, on hand-made files. ----

class ReaderRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTestDir("refusals"); }

  // The status of opening a file made of `header` and `data`.
  absl::Status OpenRaw(const std::string& header, const std::string& data) {
    const std::string path = WriteRaw(absl::StrCat(dir_, "/f", count_++), header, data);
    return SafetensorsReader::Open(path).status();
  }

  void ExpectDataLoss(const absl::Status& status, const std::string& fragment) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), fragment))
        << "\"" << status.message() << "\" lacks \"" << fragment << "\"";
  }

  std::string dir_;
  int count_ = 0;
};

constexpr char kTensorA[] = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST_F(ReaderRefusalTest, AValidHandMadeFileOpens) {
  EXPECT_TRUE(OpenRaw(absl::StrCat("{", kTensorA, "}"), std::string(8, 'x')).ok());
  EXPECT_TRUE(OpenRaw("  {}  ", "").ok());
}

TEST_F(ReaderRefusalTest, ShortFileAndHeaderLengthBeyondTheFile) {
  ASSERT_TRUE(WriteFileDurably(dir_ + "/short", "abc").ok());
  ExpectDataLoss(SafetensorsReader::Open(dir_ + "/short").status(), "fewer than the 8-byte");
  ASSERT_TRUE(WriteFileDurably(dir_ + "/long", LittleEndian64(1000) + "{}").ok());
  ExpectDataLoss(SafetensorsReader::Open(dir_ + "/long").status(),
                 "header length 1000 reaches beyond the file");
}

TEST_F(ReaderRefusalTest, HeaderThatIsNotAJsonObject) {
  ExpectDataLoss(OpenRaw("{\"a\":", ""), "header: JSON at byte 5");
  ExpectDataLoss(OpenRaw("[]", ""), "the header is an array");
  ExpectDataLoss(OpenRaw("{} x", ""), "unexpected text after the value");
}

TEST_F(ReaderRefusalTest, DuplicateTensorName) {
  ExpectDataLoss(OpenRaw(absl::StrCat("{", kTensorA, ",", kTensorA, "}"), std::string(16, 'x')),
                 "duplicate name \"a\"");
}

TEST_F(ReaderRefusalTest, MalformedTensorEntries) {
  ExpectDataLoss(OpenRaw(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x')),
                 "tensor \"a\": no dtype");
  ExpectDataLoss(OpenRaw(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, 'x')),
                 "tensor \"a\": no shape");
  ExpectDataLoss(OpenRaw(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, 'x')),
                 "tensor \"a\": no data_offsets");
  ExpectDataLoss(OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})",
                         std::string(8, 'x')),
                 "tensor \"a\": unknown field \"x\"");
  ExpectDataLoss(
      OpenRaw(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x')),
      "tensor \"a\": unknown dtype \"Q7\"");
  ExpectDataLoss(
      OpenRaw(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", std::string(8, 'x')),
      "tensor \"a\": shape[1]: -1 is not a non-negative");
  ExpectDataLoss(
      OpenRaw(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::string(8, 'x')),
      "shape[0]: 2.5 is not");
  ExpectDataLoss(
      OpenRaw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x')),
      "tensor \"a\": dtype F32 x shape [3] is 12 bytes, but data_offsets [0, 8] hold 8");
  ExpectDataLoss(
      OpenRaw(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, 'x')),
      "end before they begin");
}

TEST_F(ReaderRefusalTest, OffsetsOverlappingWithGapsOrOutOfRange) {
  const std::string b_overlapping = R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]})";
  ExpectDataLoss(
      OpenRaw(absl::StrCat("{", kTensorA, ",", b_overlapping, "}"), std::string(12, 'x')),
      "tensor \"b\" (data_offsets [4, 12]) overlaps tensor \"a\", which ends at 8");
  const std::string b_gap = R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]})";
  ExpectDataLoss(OpenRaw(absl::StrCat("{", kTensorA, ",", b_gap, "}"), std::string(20, 'x')),
                 "tensor \"b\" (data_offsets [12, 20]) leaves a gap of 4 bytes");
  const std::string b_after = R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})";
  ExpectDataLoss(OpenRaw(absl::StrCat("{", kTensorA, ",", b_after, "}"), std::string(12, 'x')),
                 "tensor \"b\" (data_offsets [8, 16]) ends beyond the data section, which holds "
                 "12 bytes");
  ExpectDataLoss(OpenRaw(absl::StrCat("{", kTensorA, "}"), std::string(9, 'x')),
                 "the tensors cover 8 bytes of data, but the file holds 9");
  // Listed out of offset order in the header is fine: the offsets decide.
  EXPECT_TRUE(OpenRaw(absl::StrCat("{", b_after, ",", kTensorA, "}"), std::string(16, 'x')).ok());
}

TEST_F(ReaderRefusalTest, MetadataValuesMustBeStrings) {
  ExpectDataLoss(OpenRaw(R"({"__metadata__":{"step":12}})", ""),
                 "__metadata__ \"step\" is a number, not a string");
  ExpectDataLoss(OpenRaw(R"({"__metadata__":[]})", ""), "__metadata__ is an array");
}

TEST_F(ReaderRefusalTest, TruncatedFileIsNamedAsSuch) {
  const std::string path = dir_ + "/trunc.safetensors";
  const std::string data = RandomBytes(4096, 9);
  ASSERT_TRUE(WriteAll(path,
                       {{"w", SafetensorsDType::kF32, {512}}, {"v", SafetensorsDType::kF32, {512}}},
                       {}, data)
                  .ok());
  ASSERT_EQ(::truncate(path.c_str(), 3000), 0);
  const absl::Status status = SafetensorsReader::Open(path).status();
  ExpectDataLoss(status, "tensor \"v\" (data_offsets [2048, 4096]) ends beyond the data section");
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "truncated")) << status;
  // Cut inside the header: the header length now reaches beyond the file.
  ASSERT_EQ(::truncate(path.c_str(), 20), 0);
  ExpectDataLoss(SafetensorsReader::Open(path).status(), "reaches beyond the file");
}

TEST_F(ReaderRefusalTest, EscapesAndUnicodeInNames) {
  const std::string header =
      R"({"\u00e4\ud83d\ude00\/\"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  const std::string path = WriteRaw(dir_ + "/escapes", header, "q");
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_NE((*reader)->Find("\xc3\xa4\xf0\x9f\x98\x80/\""), nullptr);
  ExpectDataLoss(OpenRaw(R"({"\ud83d":{}})", ""), "unpaired high surrogate");
  ExpectDataLoss(OpenRaw("{\"\xff\":{}}", ""), "not UTF-8");
}

}  // namespace
}  // namespace zeroshard::checkpoint
