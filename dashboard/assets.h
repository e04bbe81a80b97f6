// The dashboard's static files (dashboard/static/), embedded in the binary at build time by the
// `assets_table` genrule (embed_assets.py), with their Content-Types.
#ifndef ZEROSHARD_DASHBOARD_ASSETS_H_
#define ZEROSHARD_DASHBOARD_ASSETS_H_

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace zeroshard::dashboard {

struct Asset {
  // The path under dashboard/static/ ("index.html", "js/app.js").
  absl::string_view name;
  absl::string_view content_type;
  absl::string_view bytes;
};

// Every embedded file, sorted by name. Constant; safe from any thread.
absl::Span<const Asset> Assets();

// The file named `name`, or nullptr.
const Asset* FindAsset(absl::string_view name);

}  // namespace zeroshard::dashboard

#endif  // ZEROSHARD_DASHBOARD_ASSETS_H_
