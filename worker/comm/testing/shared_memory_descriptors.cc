// Test support: this process's descriptors of shared-memory segments, from /proc/self/fd.
#include "worker/comm/testing/shared_memory_descriptors.h"

#include <filesystem>
#include <system_error>

namespace zeroshard::comm::testing {

std::vector<std::string> SharedMemoryDescriptors() {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && (target.rfind("/dev/shm/", 0) == 0 || target.rfind("/memfd:zeroshard", 0) == 0)) {
      found.push_back(target);
    }
  }
  return found;
}

}  // namespace zeroshard::comm::testing
