// Runs a command (e.g. the `zeroshard` CLI) to completion for integration tests, with a deadline,
// and returns its exit status, stdout and stderr separately.
#ifndef ZEROSHARD_TESTS_INTEGRATION_SUBPROCESS_H_
#define ZEROSHARD_TESTS_INTEGRATION_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zeroshard::testing {

struct CommandResult {
  // As waitpid reports it (see <sys/wait.h>).
  int wait_status = 0;
  std::string stdout_text;
  std::string stderr_text;

  bool exited() const;
  // The exit code; -1 when the process did not exit normally (e.g. a signal ended it).
  int exit_code() const;
};

// Runs argv[0] (a path) with argv, stdin from /dev/null, stdout and stderr captured (through
// files under $TEST_TMPDIR, so neither can block the child). A command still running at
// `deadline` is SIGKILLed and the result is DEADLINE_EXCEEDED with what it printed so far.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration deadline);

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_INTEGRATION_SUBPROCESS_H_
