// Lookup in the generated table of the dashboard's static files.
#include "dashboard/assets.h"

#include <algorithm>

namespace zeroshard::dashboard {

const Asset* FindAsset(absl::string_view name) {
  const absl::Span<const Asset> assets = Assets();
  const auto it = std::lower_bound(
      assets.begin(), assets.end(), name,
      [](const Asset& asset, absl::string_view wanted) { return asset.name < wanted; });
  if (it == assets.end() || it->name != name) return nullptr;
  return &*it;
}

}  // namespace zeroshard::dashboard
