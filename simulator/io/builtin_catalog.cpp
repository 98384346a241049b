// Resolution of input names: files first, then the embedded copies of models/ and hwprofiles/.
#include "simulator/io/builtin_catalog.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace moeplan::io {
namespace fs = std::filesystem;

namespace {

std::string_view stem_of(std::string_view path) {
  const size_t slash = path.rfind('/');
  std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  if (base.size() > 5 && base.substr(base.size() - 5) == ".json") base.remove_suffix(5);
  return base;
}

const BuiltinFile* find_builtin(std::string_view folder, std::string_view ref) {
  // A bare name ("mixtral-8x22b"), or the repository path ("models/mixtral-8x22b.json").
  const bool repo_path = ref.starts_with(std::string(folder) + "/");
  if (!repo_path && ref.find('/') != std::string_view::npos) return nullptr;
  for (const auto& f : builtin_files()) {
    if (!f.path.starts_with(std::string(folder) + "/")) continue;
    if (f.path.substr(folder.size() + 1).find('/') != std::string_view::npos) continue;  // top level only
    if (repo_path ? f.path == ref : stem_of(f.path) == ref) return &f;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> builtin_names(std::string_view folder) {
  std::vector<std::string> out;
  for (const auto& f : builtin_files()) {
    if (!f.path.starts_with(std::string(folder) + "/")) continue;
    if (f.path.substr(folder.size() + 1).find('/') != std::string_view::npos) continue;
    if (!f.path.ends_with(".json")) continue;
    out.emplace_back(stem_of(f.path));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<json> read_input(const std::string& ref, std::string_view folder, const std::string& base_dir,
                        std::string* label, std::string* stem) {
  if (ref.empty())
    return Error{fmt::format("expected a {} file or built-in name, got an empty string", folder)};
  fs::path p(ref);
  if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
  std::error_code ec;
  if (fs::exists(p, ec)) {
    if (label) *label = p.string();
    if (stem) *stem = std::string(stem_of(ref));
    if (fs::is_directory(p, ec))
      return Error{fmt::format("{}: is a directory, expected a JSON file", p.string())};
    return parse_json_file(p.string());
  }
  if (const BuiltinFile* f = find_builtin(folder, ref)) {
    const std::string name = fmt::format("builtin:{}", f->path);
    if (label) *label = name;
    if (stem) *stem = std::string(stem_of(f->path));
    return parse_json_text(f->text, name);
  }
  return Error{fmt::format("{}: no such file, and not a built-in {} name (built-ins: {})", p.string(), folder,
                           fmt::join(builtin_names(folder), ", "))};
}

}  // namespace moeplan::io
