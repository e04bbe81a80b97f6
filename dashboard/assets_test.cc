// The embedded table holds every file of dashboard/static/ byte for byte, with its Content-Type.
#include "dashboard/assets.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace zeroshard::dashboard {
namespace {

TEST(AssetsTest, EveryStaticFileIsEmbeddedWithItsContentType) {
  const std::filesystem::path root = std::filesystem::path(std::getenv("TEST_SRCDIR")) /
                                     std::getenv("TEST_WORKSPACE") / "dashboard/static";
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    const std::string name = entry.path().lexically_relative(root).generic_string();
    const Asset* asset = FindAsset(name);
    ASSERT_NE(asset, nullptr) << name;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    EXPECT_EQ(asset->bytes, bytes.str()) << name;
    const std::string extension = entry.path().extension().string();
    if (extension == ".html") EXPECT_EQ(asset->content_type, "text/html; charset=utf-8");
    if (extension == ".js") EXPECT_TRUE(absl::StartsWith(asset->content_type, "text/javascript"));
    if (extension == ".css") EXPECT_TRUE(absl::StartsWith(asset->content_type, "text/css"));
    if (extension == ".svg") EXPECT_EQ(asset->content_type, "image/svg+xml");
    if (extension == ".png") EXPECT_EQ(asset->content_type, "image/png");
  }
  EXPECT_EQ(Assets().size(), files);
  ASSERT_NE(FindAsset("index.html"), nullptr);
  EXPECT_EQ(FindAsset("missing.html"), nullptr);
  EXPECT_EQ(FindAsset(""), nullptr);
}

}  // namespace
}  // namespace zeroshard::dashboard
