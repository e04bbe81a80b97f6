// UniqueFd: one owned file descriptor, closed when its holder goes.
#ifndef ZEROSHARD_COMMON_UNIQUE_FD_H_
#define ZEROSHARD_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace zeroshard {

// Move-only. Thread contract: none (a value type).
class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (-1: holds none).
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  bool valid() const { return fd_ >= 0; }
  int get() const { return fd_; }
  // Gives up ownership: the caller closes what it returns.
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

}  // namespace zeroshard

#endif  // ZEROSHARD_COMMON_UNIQUE_FD_H_
