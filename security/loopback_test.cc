// IsLoopbackTarget over the target forms gRPC accepts.
#include "security/loopback.h"

#include "gtest/gtest.h"

namespace zeroshard::security {
namespace {

TEST(IsLoopbackTargetTest, LoopbackAddressesLocalhostAndUnixSockets) {
  for (const char* target :
       {"127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "LOCALHOST.:1", "localhost",
        "[::1]:50051", "::1", "[::ffff:127.0.0.1]:1", "dns:localhost:1", "dns:///127.0.0.1:1",
        "dns://8.8.8.8/localhost:1", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:1",
        "unix:/tmp/coordinator.sock", "unix:///tmp/c.sock", "unix-abstract:zeroshard"}) {
    EXPECT_TRUE(IsLoopbackTarget(target)) << target;
  }
}

TEST(IsLoopbackTargetTest, EverythingElseIsNot) {
  for (const char* target :
       {"192.0.2.1:50051", "10.0.0.1:1", "0.0.0.0:1", "[::]:1", "[fd00::2]:1", "fd00::2",
        "coordinator.example:50051", "localhost.example:1", "mylocalhost:1", "dns:///10.0.0.1:1",
        "dns://127.0.0.1/coordinator:1", "ipv4:127.0.0.1:1,10.0.0.1:1", "ipv6:[fd00::2]:1",
        "[::ffff:10.0.0.1]:1", "128.0.0.1:1", ""}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
}

}  // namespace
}  // namespace zeroshard::security
