// RunCommand: posix_spawn with stdout/stderr redirected to temporary files, reaped by polling
// waitpid until the deadline.
#include "tests/integration/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace zeroshard::testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string OutputDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : std::filesystem::temp_directory_path().string();
}

}  // namespace

bool CommandResult::exited() const { return WIFEXITED(wait_status); }

int CommandResult::exit_code() const { return exited() ? WEXITSTATUS(wait_status) : -1; }

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration deadline) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  static std::atomic<int> next_command{0};
  const std::string prefix =
      absl::StrCat(OutputDir(), "/command.", getpid(), ".", next_command.fetch_add(1));
  const std::string stdout_path = prefix + ".stdout";
  const std::string stderr_path = prefix + ".stderr";

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdout_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_copy = argv;
  std::vector<char*> argvp;
  for (std::string& arg : argv_copy) argvp.push_back(arg.data());
  argvp.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, argvp.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(error)));
  }

  CommandResult result;
  const absl::Time end = absl::Now() + deadline;
  bool timed_out = false;
  while (true) {
    const pid_t reaped = waitpid(pid, &result.wait_status, WNOHANG);
    if (reaped == pid) break;
    if (reaped < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() >= end) {
      kill(pid, SIGKILL);
      waitpid(pid, &result.wait_status, 0);
      timed_out = true;
      break;
    }
    absl::SleepFor(kPollInterval);
  }
  result.stdout_text = ReadFile(stdout_path);
  result.stderr_text = ReadFile(stderr_path);
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        "`", absl::StrJoin(argv, " "), "` still ran after ", absl::FormatDuration(deadline),
        "; stdout:\n", result.stdout_text, "\nstderr:\n", result.stderr_text));
  }
  return result;
}

}  // namespace zeroshard::testing
