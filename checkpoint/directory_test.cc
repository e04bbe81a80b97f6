// Tests for the directory-descriptor layer on the real file system: walks from a trusted root,
// the refusal of links and wrong types at every step (naming the path), nothing outside the root
// touched, and the storage hooks that tests block or fail operations with.
#include "checkpoint/directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "checkpoint/test_hostile_storage.h"
#include "checkpoint/test_storage_hooks.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

using testing::MakeTempDir;
using testing::OutsideDirectory;
using testing::TestStorageHooks;

void Write(const std::string& path, const std::string& contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
  ::close(fd);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

Directory Root(const std::string& path, std::shared_ptr<StorageHooks> hooks = nullptr) {
  absl::StatusOr<Directory> root = Directory::OpenRoot(path, std::move(hooks));
  EXPECT_TRUE(root.ok()) << root.status();
  return *std::move(root);
}

void ExpectRefused(const absl::Status& status, const std::string& path, absl::string_view what) {
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(IsRefusal(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat(path, " is ", what)))
      << status << " (expected " << path << " is " << what << ")";
}

TEST(DirectoryTest, WalksOneComponentAtATimeAndRefusesALinkAtAnyLevel) {
  const std::string root = MakeTempDir("walk");
  const OutsideDirectory outside("walk_outside");
  ASSERT_EQ(::mkdir((root + "/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/a/b").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(outside.path().c_str(), (root + "/link").c_str()), 0);
  ASSERT_EQ(::symlink(outside.path().c_str(), (root + "/a/b/link").c_str()), 0);
  Write(root + "/a/file", "x");

  absl::StatusOr<Directory> b = Root(root).OpenPath("a/b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->path(), root + "/a/b");
  ExpectRefused(Root(root).OpenPath("link/b").status(), root + "/link",
                "a symbolic link, where a directory is expected: refused (checkpoint storage "
                "never follows links)");
  ExpectRefused(Root(root).OpenPath("a/b/link").status(), root + "/a/b/link", "a symbolic link");
  ExpectRefused(Root(root).OpenPath("a/file").status(), root + "/a/file",
                "a regular file, where a directory is expected: refused");
  EXPECT_EQ(Root(root).OpenPath("a/missing").status().code(), absl::StatusCode::kNotFound);
  for (const char* bad : {"/abs", "a/../a", "a//b", "a/./b", "a/"}) {
    EXPECT_EQ(Root(root).OpenPath(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(Root(root).OpenPath("").value().path(), root);
  // The root itself is trusted: an operator's link to it is followed.
  const std::string root_link = MakeTempDir("walk_root_parent") + "/root";
  ASSERT_EQ(::symlink(root.c_str(), root_link.c_str()), 0);
  EXPECT_TRUE(Root(root_link).OpenPath("a/b").ok());
  EXPECT_TRUE(outside.Unchanged());
}

TEST(DirectoryTest, RefusalsAreToldFromErrnoStatusesOfTheSameCode) {
  const absl::Status not_empty = ErrnoError("rmdir", "/x", ENOTEMPTY);
  EXPECT_EQ(not_empty.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(IsRefusal(not_empty));
  EXPECT_TRUE(IsRefusal(RefusedEntry("/x", S_IFLNK | 0777, EntryType::kDirectory)));
  EXPECT_TRUE(IsRefusal(RefusedError("another job's")));
  EXPECT_FALSE(IsRefusal(absl::OkStatus()));
}

TEST(DirectoryTest, CreatePathMakesWhatIsMissingAndNeverCreatesThroughALink) {
  const std::string root = MakeTempDir("create_path");
  const OutsideDirectory outside("create_path_outside");
  absl::StatusOr<Directory> made = Root(root).CreatePath("team/job/step-1");
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_TRUE(Exists(root + "/team/job/step-1"));
  EXPECT_TRUE(Root(root).CreatePath("team/job/step-1").ok());  // existing is fine

  ASSERT_EQ(::symlink(outside.path().c_str(), (root + "/team/linked").c_str()), 0);
  ExpectRefused(Root(root).CreatePath("team/linked/step-1").status(), root + "/team/linked",
                "a symbolic link");
  // A dangling link is not created through either.
  const std::string dangling_target = outside.path() + "/would-be-created";
  ASSERT_EQ(::symlink(dangling_target.c_str(), (root + "/team/dangling").c_str()), 0);
  ExpectRefused(Root(root).CreatePath("team/dangling/x").status(), root + "/team/dangling",
                "a symbolic link");
  EXPECT_FALSE(Exists(dangling_target));
  EXPECT_TRUE(outside.Unchanged());
}

TEST(DirectoryTest, OpenFileRefusesLinksDirectoriesAndFifosWithoutBlocking) {
  const std::string root = MakeTempDir("open_file");
  const OutsideDirectory outside("open_file_outside");
  Write(root + "/plain", "contents");
  ASSERT_EQ(::symlink(outside.file().c_str(), (root + "/link").c_str()), 0);
  ASSERT_EQ(::mkdir((root + "/dir").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((root + "/fifo").c_str(), 0644), 0);
  const Directory directory = Root(root);

  absl::StatusOr<File> plain = directory.OpenFile("plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->path(), root + "/plain");
  EXPECT_EQ(*plain->Size(), 8u);
  ExpectRefused(directory.OpenFile("link").status(), root + "/link",
                "a symbolic link, where a regular file is expected");
  ExpectRefused(directory.OpenFile("dir").status(), root + "/dir", "a directory");
  // Opening a FIFO for reading would wait for a writer: it is refused from its type.
  ExpectRefused(directory.OpenFile("fifo").status(), root + "/fifo", "a FIFO");
  EXPECT_EQ(directory.OpenFile("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(directory.OpenFile("..").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(directory.OpenFile("a/b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(outside.Unchanged());
}

// What a trainer passes over the attach socket is adopted only as what it claims to be: a
// directory, or a regular file open for reading (a FIFO could block the worker's reads).
TEST(DirectoryTest, PassedDescriptorsAreAdoptedOnlyAsWhatTheyClaimToBe) {
  const std::string root = MakeTempDir("passed");
  const std::string file = root + "/file";
  ASSERT_EQ(::close(::open(file.c_str(), O_WRONLY | O_CREAT, 0644)), 0);
  ASSERT_EQ(::mkfifo((root + "/fifo").c_str(), 0644), 0);

  absl::StatusOr<Directory> directory = Directory::FromPassedDescriptor(
      ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), "/named/by/the/trainer");
  ASSERT_TRUE(directory.ok()) << directory.status();
  EXPECT_EQ(directory->path(), "/named/by/the/trainer");
  EXPECT_TRUE(directory->OpenFile("file").ok());
  const absl::Status not_a_directory =
      Directory::FromPassedDescriptor(::open(file.c_str(), O_RDONLY | O_CLOEXEC), "/x").status();
  EXPECT_TRUE(absl::IsInvalidArgument(not_a_directory)) << not_a_directory;
  EXPECT_TRUE(absl::StrContains(not_a_directory.message(),
                                "/x: the descriptor passed for it is "
                                "not a directory"))
      << not_a_directory;

  // Fails before the fix (issue 36, row 10): an O_PATH descriptor of a directory, which needs
  // no read permission on it, was adopted as the step directory.
  const absl::Status path_only =
      Directory::FromPassedDescriptor(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC),
                                      "/step")
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(path_only)) << path_only;
  EXPECT_TRUE(absl::StrContains(path_only.message(),
                                "/step: the descriptor passed for it is "
                                "not open for reading (an O_PATH"))
      << path_only;

  EXPECT_TRUE(File::FromPassedDescriptor(::open(file.c_str(), O_RDONLY | O_CLOEXEC), "/f").ok());
  for (const int fd :
       {::open(file.c_str(), O_WRONLY | O_CLOEXEC), ::open(file.c_str(), O_PATH | O_CLOEXEC),
        ::open((root + "/fifo").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC),
        ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), -1}) {
    const absl::Status refused = File::FromPassedDescriptor(fd, "/f").status();
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  }
}

TEST(DirectoryTest, CreateFileNeverWritesThroughALink) {
  const std::string root = MakeTempDir("create_file");
  const OutsideDirectory outside("create_file_outside");
  ASSERT_EQ(::symlink(outside.file().c_str(), (root + "/link").c_str()), 0);
  const std::string dangling_target = outside.path() + "/new";
  ASSERT_EQ(::symlink(dangling_target.c_str(), (root + "/dangling").c_str()), 0);
  const Directory directory = Root(root);
  EXPECT_EQ(directory.CreateFile("link").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(directory.CreateFile("dangling").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(Exists(dangling_target));
  absl::StatusOr<File> created = directory.CreateFile("new");
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(::write(created->fd(), "abc", 3), 3);
  EXPECT_TRUE(created->Close().ok());
  EXPECT_TRUE(outside.Unchanged());
}

TEST(DirectoryTest, ListStatUnlinkAndRemoveDirNeverFollowALink) {
  const std::string root = MakeTempDir("list");
  const OutsideDirectory outside("list_outside");
  Write(root + "/file", "x");
  ASSERT_EQ(::mkdir((root + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(outside.path().c_str(), (root + "/dir-link").c_str()), 0);
  ASSERT_EQ(::symlink(outside.file().c_str(), (root + "/file-link").c_str()), 0);
  const Directory directory = Root(root);

  absl::StatusOr<std::vector<DirectoryEntry>> entries = directory.List();
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 4u);
  EXPECT_EQ((*entries)[0].name, "dir-link");
  EXPECT_EQ((*entries)[0].type, EntryType::kSymlink);
  EXPECT_EQ((*entries)[1].type, EntryType::kRegularFile);
  EXPECT_EQ((*entries)[2].type, EntryType::kSymlink);
  EXPECT_EQ((*entries)[3].type, EntryType::kDirectory);
  EXPECT_TRUE(S_ISLNK(directory.Stat("dir-link")->st_mode));
  EXPECT_EQ(directory.Stat("missing").status().code(), absl::StatusCode::kNotFound);

  // A link to a directory is not a directory to remove, and removing a link leaves its target.
  EXPECT_FALSE(directory.RemoveDir("dir-link").ok());
  ASSERT_TRUE(directory.Unlink("file-link").ok());
  ASSERT_TRUE(directory.Unlink("dir-link").ok());
  EXPECT_FALSE(Exists(root + "/dir-link"));
  ASSERT_TRUE(directory.RemoveDir("sub").ok());
  ASSERT_TRUE(directory.Rename("file", "renamed").ok());
  EXPECT_TRUE(Exists(root + "/renamed"));
  EXPECT_TRUE(directory.Sync().ok());
  EXPECT_TRUE(outside.Unchanged());
}

TEST(DirectoryTest, HooksSeeOperationsOfEverythingOpenedFromTheRootAndCanFailThem) {
  const std::string root = MakeTempDir("hooks");
  auto hooks = std::make_shared<TestStorageHooks>();
  const Directory directory = Root(root, hooks);
  absl::StatusOr<Directory> child = directory.CreateChild("child");
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(child->CreateFile("f").ok());
  ASSERT_TRUE(child->Sync().ok());
  const std::vector<TestStorageHooks::Operation> seen = hooks->operations();
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0].operation, StorageOperation::kOpen);
  EXPECT_EQ(seen[0].path, root);
  EXPECT_EQ(seen[1].operation, StorageOperation::kMakeDirectory);
  EXPECT_EQ(seen[1].path, root + "/child");
  EXPECT_EQ(seen[2].operation, StorageOperation::kOpen);
  EXPECT_EQ(seen[3].operation, StorageOperation::kCreate);
  EXPECT_EQ(seen[3].path, root + "/child/f");
  EXPECT_EQ(seen[4].operation, StorageOperation::kSync);

  hooks->FailAt(StorageOperation::kUnlink, "/child/f", absl::UnavailableError("volume gone"));
  EXPECT_EQ(child->Unlink("f").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Exists(root + "/child/f"));  // failed before it touched the volume
}

TEST(DirectoryTest, AHookHoldsAnOperationUntilReleased) {
  const std::string root = MakeTempDir("hold");
  auto hooks = std::make_shared<TestStorageHooks>();
  const Directory directory = Root(root, hooks);
  hooks->HoldAt(StorageOperation::kCreate, "/held");
  absl::Status created = absl::UnknownError("not run");
  std::thread creator([&] { created = directory.CreateFile("held").status(); });
  ASSERT_TRUE(hooks->AwaitHeld(absl::Seconds(30)));
  // Held before the system call: nothing exists yet, and other operations go on.
  EXPECT_FALSE(Exists(root + "/held"));
  EXPECT_TRUE(directory.CreateFile("other").ok());
  hooks->Release();
  creator.join();
  EXPECT_TRUE(created.ok()) << created;
  EXPECT_TRUE(Exists(root + "/held"));
  EXPECT_EQ(hooks->held(), 0);
}

}  // namespace
}  // namespace zeroshard::checkpoint
