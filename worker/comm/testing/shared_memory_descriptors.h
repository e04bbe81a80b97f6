// Test support: which shared-memory segments this process still holds a descriptor of, for the
// checks that a shared-memory link leaves nothing behind.
#ifndef ZEROSHARD_WORKER_COMM_TESTING_SHARED_MEMORY_DESCRIPTORS_H_
#define ZEROSHARD_WORKER_COMM_TESTING_SHARED_MEMORY_DESCRIPTORS_H_

#include <string>
#include <vector>

namespace zeroshard::comm::testing {

// The targets of this process's descriptors of a shared-memory segment: a /dev/shm file, or the
// memfd a shared-memory link's leader holds until its members have mapped it. Thread-compatible.
std::vector<std::string> SharedMemoryDescriptors();

}  // namespace zeroshard::comm::testing

#endif  // ZEROSHARD_WORKER_COMM_TESTING_SHARED_MEMORY_DESCRIPTORS_H_
