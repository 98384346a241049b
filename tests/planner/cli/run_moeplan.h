// Runs the `moeplan` binary as a user would (from the repository root) and captures its exit code, stdout and
// stderr; shared by the CLI tests. MOEPLAN_BIN and MOEPLAN_SOURCE_DIR come from tests/CMakeLists.txt.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace moeplan::test {

struct Run {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// `args` are already shell-quoted. Output goes through per-process temporary files (ctest runs in parallel).
inline Run run_cli(const std::string& args) {
  namespace fs = std::filesystem;
  static int counter = 0;
  const std::string base = fs::temp_directory_path() /
                           ("moeplan_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string cmd = std::string("cd '") + MOEPLAN_SOURCE_DIR + "' && '" + MOEPLAN_BIN + "' " + args +
                          " >'" + base + ".out' 2>'" + base + ".err'";
  const int status = std::system(cmd.c_str());
  Run r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}

inline int lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// A plan file under the system temp dir, unique to this process, removed when it goes out of scope.
struct TempPlan {
  std::filesystem::path path;
  TempPlan(const std::string& name, const std::string& text)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json")) {
    std::ofstream(path) << text;
  }
  ~TempPlan() { std::filesystem::remove(path); }
  std::string quoted() const { return "'" + path.string() + "'"; }
};

}  // namespace moeplan::test
