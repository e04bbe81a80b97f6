// Test support for a hostile checkpoint volume: a directory outside the checkpoint root holding
// files a planted link points at, and the check that nothing there changed (contents and file
// count, by lstat and plain reads: the test's own trusted view).
#ifndef ZEROSHARD_CHECKPOINT_TEST_HOSTILE_STORAGE_H_
#define ZEROSHARD_CHECKPOINT_TEST_HOSTILE_STORAGE_H_

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace zeroshard::checkpoint::testing {

// A fresh directory under the test's temporary directory (TEST_TMPDIR).
inline std::string MakeTempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// name -> contents of every entry of `dir` (subdirectories as "<dir>", links as "-> target").
inline std::map<std::string, std::string> SnapshotDirectory(const std::string& dir) {
  std::map<std::string, std::string> entries;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return entries;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      entries[name] = "<dir>";
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      const ssize_t n = ::readlink(path.c_str(), target, sizeof(target));
      entries[name] = absl::StrCat("-> ", std::string(target, n > 0 ? n : 0));
    } else {
      std::ifstream in(path, std::ios::binary);
      std::stringstream contents;
      contents << in.rdbuf();
      entries[name] = contents.str();
    }
  }
  ::closedir(d);
  return entries;
}

// A directory outside the checkpoint root with `files` files in it, the target of planted links.
// The reproduction: three step-* links at a directory of 5 files, all deleted.
class OutsideDirectory {
 public:
  // `decoys`: also a manifest.json and a rank file, the names a checkpoint reader, writer or
  // pruner would touch should it follow a link here.
  explicit OutsideDirectory(const std::string& name, int files = 5, bool decoys = true)
      : path_(MakeTempDir(name)) {
    for (int i = 0; i < files; ++i) {
      std::ofstream(absl::StrCat(path_, "/precious-", i, ".txt")) << "precious file " << i;
    }
    if (decoys) {
      std::ofstream(absl::StrCat(path_, "/manifest.json")) << "not yours";
      std::ofstream(absl::StrCat(path_, "/rank-00000-of-00001.safetensors")) << "not yours";
    }
    before_ = SnapshotDirectory(path_);
  }

  const std::string& path() const { return path_; }
  // One of its files.
  std::string file() const { return absl::StrCat(path_, "/precious-0.txt"); }
  // Entries there now.
  size_t count() const { return SnapshotDirectory(path_).size(); }
  // Whether every file is there with its contents, and nothing was added.
  bool Unchanged() const { return SnapshotDirectory(path_) == before_; }

 private:
  std::string path_;
  std::map<std::string, std::string> before_;
};

}  // namespace zeroshard::checkpoint::testing

#endif  // ZEROSHARD_CHECKPOINT_TEST_HOSTILE_STORAGE_H_
