// IsLoopbackTarget over the target forms gRPC accepts.
#include "security/loopback.h"

#include "gtest/gtest.h"

namespace zeroshard::security {
namespace {

TEST(IsLoopbackTargetTest, LoopbackAddressesLocalhostAndUnixSockets) {
  for (const char* target :
       {"127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "LocalHost:1", "localhost",
        "[::1]:50051", "::1", "0:0:0:0:0:0:0:1", "[::ffff:127.0.0.1]:1", "dns:localhost:1",
        "dns:/localhost:1", "dns:///127.0.0.1:1", "dns:///localhost:1", "dns:///[::1]:1",
        "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:1", "unix:/tmp/coordinator.sock",
        "unix:///tmp/c.sock", "unix-abstract:zeroshard"}) {
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

// Issue 36, row 9. Fails before the fix: `localhost.` (trailing dot) and `localhost` under a
// dns:// authority counted as loopback, but gRPC asks a DNS server for both (the one the
// authority names, or the system's for the fully qualified `localhost.`), so the bearer token
// went in plaintext to whatever address that server answered.
TEST(IsLoopbackTargetTest, NamesADnsServerResolvesAreNotLoopback) {
  for (const char* target :
       {"localhost.:1", "LOCALHOST.:1", "localhost.", "dns:///localhost.:1", "dns:localhost.:1",
        "dns://8.8.8.8/localhost:1", "dns://192.0.2.53:53/localhost:1",
        "dns://8.8.8.8/localhost.:1", "dns://127.0.0.1/localhost:1", "dns://[::1]/LOCALHOST:1"}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
  // An IP literal is never looked up, whichever DNS server the target names.
  EXPECT_TRUE(IsLoopbackTarget("dns://8.8.8.8/127.0.0.1:1"));
  EXPECT_TRUE(IsLoopbackTarget("dns://8.8.8.8/[::1]:1"));
}

// Issue 36, row 9. Fails before the fix: the ipv4:/ipv6: schemes took `localhost` (gRPC parses
// only literals there), and ports or forms gRPC would not take as written were judged by their
// host alone.
TEST(IsLoopbackTargetTest, OnlyWellFormedLiteralsAndPortsCount) {
  for (const char* target :
       {"ipv4:localhost:1", "ipv6:[localhost]:1", "127.0.0.1.:1", "127.1:1", "2130706433:1",
        "[::1%lo]:1", "localhost:1/x", "localhost:1?x", "localhost:https", "localhost:", "[::1",
        "[::1]x", "dns://8.8.8.8", "dns:", "%6cocalhost:1", "unix", "vsock:1:1"}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
}

}  // namespace
}  // namespace zeroshard::security
