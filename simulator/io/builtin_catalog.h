// The models and hardware profiles shipped in models/ and hwprofiles/, embedded in the binary at build time,
// so `moeplan` runs anywhere with `--model mixtral-8x22b` and a plan can name `hwprofiles/h100-sxm.json`.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "simulator/core/status.h"
#include "simulator/io/json_reader.h"

namespace moeplan::io {

struct BuiltinFile {
  std::string_view path;  // as in the repository: "models/mixtral-8x22b.json"
  std::string_view text;
};

std::span<const BuiltinFile> builtin_files();  // defined in the generated builtin_data.cpp

// Built-in names in a folder ("models" or "hwprofiles"): file stems, sorted.
std::vector<std::string> builtin_names(std::string_view folder);

// Reads a JSON input named by `ref`: an existing file (relative to `base_dir` when relative), else a built-in
// by name ("mixtral-8x22b") or by repository path ("models/mixtral-8x22b.json"). `label` receives the file
// name used in messages; `stem` the file's stem (the default model name).
Result<json> read_input(const std::string& ref, std::string_view folder, const std::string& base_dir,
                        std::string* label, std::string* stem);

}  // namespace moeplan::io
