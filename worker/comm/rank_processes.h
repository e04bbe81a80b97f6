// Runs one process per rank of a multi-process benchmark or test: the same binary again, told
// its rank and a directory the ranks share for a FileStore rendezvous.
#ifndef ZEROSHARD_WORKER_COMM_RANK_PROCESSES_H_
#define ZEROSHARD_WORKER_COMM_RANK_PROCESSES_H_

#include <string>
#include <vector>

namespace zeroshard::comm {

// Starts `world_size` copies of the binary at `self`, each with `args` followed by
// --rank=<r> and --store_dir=<a fresh temporary directory>, waits for all of them and removes
// the directory. Returns 0 when every rank exited 0; otherwise prints how many failed (prefixed
// with `name`) and returns 1.
int RunRankProcesses(const char* self, int world_size, const std::vector<std::string>& args,
                     const char* name);

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_RANK_PROCESSES_H_
