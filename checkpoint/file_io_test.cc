// Tests for the checkpoint file helpers: a DurableFile appears only once committed, leaves
// nothing behind when abandoned, and its errors name the path.
#include "checkpoint/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/test_hostile_storage.h"
#include "checkpoint/test_storage_hooks.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

// A fresh directory under the test's temporary directory.
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
  std::sort(names.begin(), names.end());
  return names;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

TEST(FileIoTest, ErrnoErrorNamesOperationPathAndErrnoText) {
  const absl::Status status = ErrnoError("write", "/x/y", ENOSPC);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(status.message(), "write /x/y")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "No space left on device")) << status;
}

TEST(FileIoTest, DirectoryOf) {
  EXPECT_EQ(DirectoryOf("/a/b/c.json"), "/a/b");
  EXPECT_EQ(DirectoryOf("c.json"), ".");
  EXPECT_EQ(DirectoryOf("/c.json"), "/");
}

TEST(FileIoTest, CommittedFileAppearsWholeAndTheTemporaryIsGone) {
  const std::string dir = MakeTestDir("commit");
  const std::string path = dir + "/data.bin";
  auto file = DurableFile::Create(path);
  ASSERT_TRUE(file.ok()) << file.status();
  // More than the buffer in small and large appends.
  const std::string small(1000, 'a');
  const std::string large(3 << 20, 'b');
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE((*file)->Append(small.data(), small.size()).ok());
  ASSERT_TRUE((*file)->Append(large.data(), large.size()).ok());
  EXPECT_FALSE(Exists(path));
  ASSERT_TRUE((*file)->OverwriteAt(5, "XYZ", 3).ok());
  EXPECT_EQ((*file)->size(), 2000 * small.size() + large.size());
  ASSERT_TRUE((*file)->Commit().ok());
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"data.bin"});
  file->reset();  // destroying a committed file keeps it
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_EQ(contents->size(), 2000 * small.size() + large.size());
  EXPECT_EQ(contents->substr(0, 10), "aaaaaXYZaa");
  EXPECT_EQ(contents->substr(2000 * small.size()), large);
}

TEST(FileIoTest, OverwriteOutsideTheWrittenBytesIsRefused) {
  const std::string dir = MakeTestDir("overwrite");
  auto file = DurableFile::Create(dir + "/f");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("abcd", 4).ok());
  EXPECT_EQ((*file)->OverwriteAt(2, "xyz", 3).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE((*file)->OverwriteAt(1, "xyz", 3).ok());
}

TEST(FileIoTest, AbandonedFileLeavesNothing) {
  const std::string dir = MakeTestDir("abandon");
  {
    auto file = DurableFile::Create(dir + "/f");
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Append("abcd", 4).ok());
    EXPECT_EQ(ListDir(dir).size(), 1u);  // the temporary file
  }
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(FileIoTest, AtTheRenameTheFinalNameDoesNotExistYetAndTheTemporaryIsComplete) {
  const std::string dir = MakeTestDir("hook");
  const std::string path = dir + "/manifest.json";
  bool hook_ran = false;
  const absl::Status status = WriteFileDurably(path, "{\"a\":1}", [&] {
    hook_ran = true;
    EXPECT_FALSE(Exists(path));
    const std::vector<std::string> names = ListDir(dir);
    ASSERT_EQ(names.size(), 1u);
    EXPECT_TRUE(absl::StartsWith(names[0], ".manifest.json.tmp-")) << names[0];
    absl::StatusOr<std::string> temp = ReadFileToString(dir + "/" + names[0]);
    ASSERT_TRUE(temp.ok());
    EXPECT_EQ(*temp, "{\"a\":1}");
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(hook_ran);
  EXPECT_EQ(*ReadFileToString(path), "{\"a\":1}");
}

TEST(FileIoTest, TwoWritersOfOneNameNeverShareATemporaryFile) {
  const std::string dir = MakeTestDir("two_writers");
  const std::string path = dir + "/f";
  auto first = DurableFile::Create(path);
  auto second = DurableFile::Create(path);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE((*first)->temp_path(), (*second)->temp_path());
  ASSERT_TRUE((*first)->Append("first", 5).ok());
  ASSERT_TRUE((*second)->Append("second", 6).ok());
  ASSERT_TRUE((*first)->Commit().ok());
  EXPECT_EQ(*ReadFileToString(path), "first");
  ASSERT_TRUE((*second)->Commit().ok());
  EXPECT_EQ(*ReadFileToString(path), "second");
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"f"});
}

TEST(FileIoTest, ReplacingAFileIsAtomic) {
  const std::string dir = MakeTestDir("replace");
  const std::string path = dir + "/f";
  ASSERT_TRUE(WriteFileDurably(path, "old").ok());
  ASSERT_TRUE(WriteFileDurably(path, "new contents").ok());
  EXPECT_EQ(*ReadFileToString(path), "new contents");
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"f"});
}

TEST(FileIoTest, MissingDirectoryIsNotFoundNamingThePath) {
  const std::string path = MakeTestDir("missing") + "/no/such/dir/f";
  absl::StatusOr<std::unique_ptr<DurableFile>> file = DurableFile::Create(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(file.status().message(), "/missing/no/such/dir")) << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), "No such file or directory"));
  EXPECT_EQ(ReadFileToString(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(FileIoTest, PreadPastTheEndIsOutOfRange) {
  const std::string dir = MakeTestDir("pread");
  const std::string path = dir + "/f";
  ASSERT_TRUE(WriteFileDurably(path, "0123456789").ok());
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buffer[8];
  ASSERT_TRUE(PreadFully(fd, path, 2, buffer, 8).ok());
  EXPECT_EQ(std::string(buffer, 8), "23456789");
  const absl::Status status = PreadFully(fd, path, 4, buffer, 8);
  ::close(fd);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(status.message(), "ends at 10")) << status;
}

TEST(FileIoTest, ReadFileToStringCapsWhatItReads) {
  const std::string dir = MakeTestDir("cap");
  ASSERT_TRUE(WriteFileDurably(dir + "/f", "0123456789").ok());
  EXPECT_EQ(*ReadFileToString(dir + "/f", 10), "0123456789");
  const absl::Status status = ReadFileToString(dir + "/f", 9).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(status.message(), dir + "/f holds 10 bytes, more than the 9"))
      << status;
}

// Links planted where a DurableFile writes: under its temporary name at the very moment it is
// created, and under its final name. Neither is written through; the final-name link is refused
// (FAILED_PRECONDITION naming it), not replaced. Today's code renames over the final link
// without a word (nothing refused): this test fails there.
TEST(FileIoTest, DurableFileNeverWritesThroughAPlantedLink) {
  const std::string dir = MakeTestDir("planted");
  const testing::OutsideDirectory outside("planted_outside");
  auto hooks = std::make_shared<testing::TestStorageHooks>();
  absl::StatusOr<Directory> directory = Directory::OpenRoot(dir, hooks);
  ASSERT_TRUE(directory.ok()) << directory.status();
  std::vector<std::string> planted;
  hooks->RunAt(StorageOperation::kCreate, "", [&](const std::string& path) {
    if (!planted.empty()) return;  // the first temporary name only
    planted.push_back(path);
    ASSERT_EQ(::symlink(outside.file().c_str(), path.c_str()), 0) << path;
  });
  ASSERT_TRUE(WriteFileDurably(*directory, "data", "written").ok());
  ASSERT_EQ(planted.size(), 1u);
  EXPECT_EQ(*ReadFileToString(dir + "/data"), "written");
  EXPECT_TRUE(outside.Unchanged());

  ASSERT_EQ(::symlink(outside.file().c_str(), (dir + "/manifest.json").c_str()), 0);
  const absl::Status status = WriteFileDurably(*directory, "manifest.json", "{}");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(),
                                dir + "/manifest.json is a symbolic link, where a regular file"))
      << status;
  struct stat st;
  ASSERT_EQ(::lstat((dir + "/manifest.json").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_TRUE(outside.Unchanged());
}

TEST(FileIoTest, HooksSeeEveryWriteSyncAndRename) {
  const std::string dir = MakeTestDir("hooked");
  auto hooks = std::make_shared<testing::TestStorageHooks>();
  absl::StatusOr<Directory> directory = Directory::OpenRoot(dir, hooks);
  ASSERT_TRUE(directory.ok());
  hooks->FailAt(StorageOperation::kSync, "", absl::DataLossError("fsync lost the data"));
  EXPECT_EQ(WriteFileDurably(*directory, "f", "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(ListDir(dir).empty());  // the temporary file went with the failed commit
  std::vector<StorageOperation> kinds;
  for (const auto& operation : hooks->operations()) kinds.push_back(operation.operation);
  EXPECT_EQ(kinds, (std::vector<StorageOperation>{
                       StorageOperation::kOpen, StorageOperation::kCreate, StorageOperation::kWrite,
                       StorageOperation::kSync, StorageOperation::kUnlink}));
}

}  // namespace
}  // namespace zeroshard::checkpoint
