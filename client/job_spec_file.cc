// JSON / YAML job spec files.
#include "client/job_spec_file.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"

namespace zeroshard::client {
namespace {

// Appends the JSON text of a YAML node to `out`, visiting at most `*nodes_left` nodes (aliases
// count as often as they occur); false, with `out` incomplete, when that is not enough. Scalars
// that look like numbers or booleans stay unquoted; protobuf's JSON parser accepts quoted and
// unquoted numbers, so ambiguity costs nothing.
bool AppendJson(const YAML::Node& node, size_t* nodes_left, std::string* out) {
  if (*nodes_left == 0) return false;
  --*nodes_left;
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      out->push_back('{');
      bool first = true;
      for (const auto& entry : node) {
        if (!first) out->push_back(',');
        first = false;
        if (!AppendJson(entry.first, nodes_left, out)) return false;
        out->push_back(':');
        if (!AppendJson(entry.second, nodes_left, out)) return false;
      }
      out->push_back('}');
      return true;
    }
    case YAML::NodeType::Sequence: {
      out->push_back('[');
      for (size_t i = 0; i < node.size(); ++i) {
        if (i > 0) out->push_back(',');
        if (!AppendJson(node[i], nodes_left, out)) return false;
      }
      out->push_back(']');
      return true;
    }
    case YAML::NodeType::Scalar: {
      const std::string& scalar = node.Scalar();
      if (node.Tag() != "!" && (scalar == "true" || scalar == "false")) {
        out->append(scalar);
        return true;
      }
      out->push_back('"');
      for (char c : scalar) {
        if (c == '"' || c == '\\') out->push_back('\\');
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::Hex(c, absl::kZeroPad2));
          continue;
        }
        out->push_back(c);
      }
      out->push_back('"');
      return true;
    }
    default:
      out->append("null");
      return true;
  }
}

// Protobuf's JSON syntax errors span three lines (message, the text around the error, a caret
// under it); errors are shown as one line, so this keeps "message near 'text'".
std::string OneLine(const std::string& message) {
  const std::vector<absl::string_view> lines = absl::StrSplit(message, '\n');
  std::string out(absl::StripAsciiWhitespace(lines[0]));
  if (lines.size() > 1 && !absl::StripAsciiWhitespace(lines[1]).empty()) {
    absl::StrAppend(&out, " near '", absl::StripAsciiWhitespace(lines[1]), "'");
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text) {
  std::string json;
  const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  if (absl::StartsWith(trimmed, "{")) {
    json = std::string(trimmed);
  } else {
    try {
      const YAML::Node root = YAML::Load(std::string(text));
      if (!root.IsMap())
        return absl::InvalidArgumentError("job spec: expected a mapping of fields");
      size_t nodes_left = text.size() + kYamlSpecExtraNodes;
      if (!AppendJson(root, &nodes_left, &json)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job spec: YAML aliases expand it to more than ", text.size() + kYamlSpecExtraNodes,
            " nodes (its size in bytes plus ", kYamlSpecExtraNodes, ")"));
      }
    } catch (const YAML::Exception& e) {
      // In YAML a plain scalar starting with '*' is an alias, which is what an unquoted
      // param_groups pattern like *.bias becomes.
      const absl::string_view hint = e.msg == YAML::ErrorMsg::UNKNOWN_ANCHOR
                                         ? " (quote patterns that start with '*', e.g. \"*.bias\")"
                                         : "";
      return absl::InvalidArgumentError(absl::StrCat("job spec: malformed YAML: ", e.what(), hint));
    }
  }
  v1::JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec: ", OneLine(std::string(status.message().data(), status.message().size()))));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("spec file: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseJobSpec(text.str());
}

}  // namespace zeroshard::client
