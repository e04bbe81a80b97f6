// One process per rank, for the multi-process benchmarks.
#include "worker/comm/rank_processes.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace zeroshard::comm {

int RunRankProcesses(const char* self, int world_size, const std::vector<std::string>& args,
                     const char* name) {
  std::string directory = absl::StrCat("/tmp/", name, ".XXXXXX");
  if (mkdtemp(directory.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::vector<pid_t> children;
  int failures = 0;
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> rank_args = {self};
    rank_args.insert(rank_args.end(), args.begin(), args.end());
    rank_args.push_back(absl::StrCat("--rank=", rank));
    rank_args.push_back(absl::StrCat("--store_dir=", directory));
    std::vector<char*> argv;
    for (std::string& arg : rank_args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid;
    // posix_spawn returns its error number; it does not set errno.
    if (const int error = posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ);
        error != 0) {
      std::fprintf(stderr, "posix_spawn: %s\n", std::strerror(error));
      ++failures;
      break;
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(directory, ignored);
  if (failures > 0) std::fprintf(stderr, "%s: %d rank(s) failed\n", name, failures);
  return failures > 0 ? 1 : 0;
}

}  // namespace zeroshard::comm
