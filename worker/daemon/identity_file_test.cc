// The identity file: written atomically with mode 0600, read back; no file is no identity; a link,
// a file others may read and one that is not an identity are errors naming identity_file.
#include "worker/daemon/identity_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace zeroshard::worker {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(IdentityFileTest, KeepsTheLatestIdentityPrivately) {
  const std::string path = FreshDir("kept") + "/identity";
  absl::StatusOr<std::optional<WorkerIdentity>> none = ReadIdentityFile(path);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(WriteIdentityFile(path, {"worker-000001", "secret-1"}).ok());
  ASSERT_TRUE(WriteIdentityFile(path, {"worker-000002", "secret-2"}).ok());
  absl::StatusOr<std::optional<WorkerIdentity>> kept = ReadIdentityFile(path);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(kept->has_value());
  EXPECT_EQ((*kept)->worker_id, "worker-000002");
  EXPECT_EQ((*kept)->secret, "secret-2");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(IdentityFileTest, RefusesLinksOpenFilesAndOtherContents) {
  const std::string dir = FreshDir("refused");
  const std::string real = dir + "/real";
  ASSERT_TRUE(WriteIdentityFile(real, {"worker-000001", "secret"}).ok());
  const std::string link = dir + "/link";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  const absl::Status linked = ReadIdentityFile(link).status();
  EXPECT_EQ(linked.code(), absl::StatusCode::kFailedPrecondition) << linked;
  EXPECT_TRUE(absl::StrContains(linked.message(), "identity_file: ")) << linked;

  ASSERT_EQ(chmod(real.c_str(), 0644), 0);
  const absl::Status readable = ReadIdentityFile(real).status();
  EXPECT_EQ(readable.code(), absl::StatusCode::kFailedPrecondition) << readable;
  EXPECT_TRUE(absl::StrContains(readable.message(), "mode 0600")) << readable;

  const std::string other = dir + "/other";
  std::ofstream(other) << "not an identity\n";
  ASSERT_EQ(chmod(other.c_str(), 0600), 0);
  const absl::Status garbage = ReadIdentityFile(other).status();
  EXPECT_EQ(garbage.code(), absl::StatusCode::kFailedPrecondition) << garbage;
  EXPECT_TRUE(absl::StrContains(garbage.message(), "is not a worker identity")) << garbage;
}

}  // namespace
}  // namespace zeroshard::worker
