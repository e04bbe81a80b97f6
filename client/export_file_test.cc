// Tests for `zeroshard export` against an in-process coordinator over loopback gRPC: the file and
// descriptor writers (bytes, summary, no file after a failure) and the command itself.
#include "client/export_file.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "apps/coordinator/coordinator_server.h"
#include "client/coordinator_client.h"
#include "coordinator/test_checkpointed_job.h"
#include "gtest/gtest.h"

namespace zeroshard::client {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// A coordinator with a checkpoint root and one job that SUCCEEDED with checkpoints at steps 2 and
// 4 (its last), plus a directory to export into.
class ExportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string base =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(base);
    root_ = base + "/checkpoints";
    out_dir_ = base + "/out";
    std::filesystem::create_directories(root_);
    std::filesystem::create_directories(out_dir_);
    coordinator::CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir = base + "/state";
    options.manager.checkpoint_root = root_;
    absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
        coordinator::CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<CoordinatorClient>(server_->grpc_target());
    absl::StatusOr<v1::Job> job = coordinator::testing::RunCheckpointedJob(
        *client_->stub(), root_, coordinator::testing::CheckpointedJobOptions());
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state(), v1::SUCCEEDED);
    job_ = *std::move(job);
  }

  std::string Expected(int64_t step, bool is_final) {
    absl::StatusOr<std::string> expected =
        coordinator::testing::ExpectedExport(root_, job_, step, is_final);
    EXPECT_TRUE(expected.ok()) << expected.status();
    return expected.ok() ? *expected : "";
  }

  std::string root_;
  std::string out_dir_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::unique_ptr<CoordinatorClient> client_;
  v1::Job job_;
};

TEST_F(ExportFileTest, TheFinalCheckpointLandsWholeUnderItsName) {
  const std::string path = out_dir_ + "/model.safetensors";
  absl::StatusOr<ExportSummary> summary = ExportToFile(*client_, job_.id(), std::nullopt, path);
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::string expected = Expected(4, true);
  EXPECT_EQ(summary->step, 4);
  EXPECT_TRUE(summary->final_state);
  EXPECT_EQ(summary->tensor_count, 4);
  EXPECT_EQ(summary->bytes, static_cast<int64_t>(expected.size()));
  EXPECT_TRUE(ReadWhole(path) == expected) << "the file differs from the export";
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(ExportFileTest, AFailedExportLeavesNoFileAndAnOldOneUntouched) {
  const std::string fresh = out_dir_ + "/fresh.safetensors";
  absl::StatusOr<ExportSummary> refused = ExportToFile(*client_, job_.id(), 3, fresh);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "committed steps: 2, 4"))
      << refused.status();
  EXPECT_TRUE(ListDir(out_dir_).empty());

  const std::string old = out_dir_ + "/old.safetensors";
  std::ofstream(old) << "yesterday's weights";
  refused = ExportToFile(*client_, "job-999999", std::nullopt, old);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_EQ(ReadWhole(old), "yesterday's weights");
  EXPECT_EQ(ListDir(out_dir_), std::vector<std::string>{"old.safetensors"});

  // A later good export replaces it.
  ASSERT_TRUE(ExportToFile(*client_, job_.id(), 2, old).ok());
  EXPECT_TRUE(ReadWhole(old) == Expected(2, false)) << "the replaced file differs";
}

TEST_F(ExportFileTest, AMissingDirectoryIsNamed) {
  const std::string path = out_dir_ + "/no/such/dir/model.safetensors";
  const absl::Status refused = ExportToFile(*client_, job_.id(), std::nullopt, path).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), out_dir_ + "/no/such/dir")) << refused;
}

TEST_F(ExportFileTest, ADescriptorGetsTheBytesAsTheyArrive) {
  const std::string path = out_dir_ + "/stdout";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  absl::StatusOr<ExportSummary> summary = ExportToDescriptor(*client_, job_.id(), 2, fd);
  ::close(fd);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->step, 2);
  EXPECT_FALSE(summary->final_state);
  EXPECT_TRUE(ReadWhole(path) == Expected(2, false)) << "the descriptor's bytes differ";
}

// Runs `zeroshard --coordinator=... <args>` with stdout and stderr into files; its exit code.
int RunCli(const std::string& target, const std::string& args, const std::string& stdout_path,
           const std::string& stderr_path) {
  const std::string command = absl::StrCat("client/zeroshard --coordinator=", target, " ", args,
                                           " > '", stdout_path, "' 2> '", stderr_path, "'");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(ExportFileTest, TheCommandWritesAFileOrStdoutAndSaysWhatItWrote) {
  const std::string path = out_dir_ + "/model.safetensors";
  const std::string out = out_dir_ + "/stdout";
  const std::string err = out_dir_ + "/stderr";
  const std::string target = server_->grpc_target();
  ASSERT_EQ(RunCli(target, absl::StrCat("export ", job_.id(), " --output=", path), out, err), 0)
      << ReadWhole(err);
  const std::string expected = Expected(4, true);
  EXPECT_TRUE(ReadWhole(path) == expected) << "the file differs from the export";
  EXPECT_EQ(ReadWhole(out), "");
  EXPECT_EQ(ReadWhole(err), absl::StrCat("zeroshard: exported ", job_.id(), " step 4 (final): 4 ",
                                         "tensors, ", expected.size(), " bytes to ", path, "\n"));

  ASSERT_EQ(RunCli(target, absl::StrCat("export ", job_.id(), " --step=2 --output=-"), out, err), 0)
      << ReadWhole(err);
  EXPECT_TRUE(ReadWhole(out) == Expected(2, false)) << "stdout differs from the export";
  EXPECT_TRUE(absl::StrContains(ReadWhole(err), "step 2 (checkpoint)")) << ReadWhole(err);

  const std::string refused = out_dir_ + "/refused.safetensors";
  EXPECT_EQ(
      RunCli(target, absl::StrCat("export ", job_.id(), " --step=3 --output=", refused), out, err),
      1);
  const std::string error = ReadWhole(err);
  EXPECT_TRUE(absl::StartsWith(error, "zeroshard: error: NOT_FOUND: step: ")) << error;
  EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
  EXPECT_FALSE(std::filesystem::exists(refused));

  EXPECT_EQ(RunCli(target, absl::StrCat("export ", job_.id()), out, err), 2);
  EXPECT_TRUE(absl::StrContains(ReadWhole(err), "--output=PATH")) << ReadWhole(err);
}

}  // namespace
}  // namespace zeroshard::client
