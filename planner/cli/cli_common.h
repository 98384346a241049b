// Shared pieces of the `moeplan` subcommands: exit codes, one-line errors, number formatting.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace moeplan::cli {

// DESIGN.md: 0 success; 2 bad input or arguments; 3 a plan that cannot run; anything else is a bug.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInfeasible = 3;

// Prints "moeplan: error: <message>" as one line on stderr and returns kExitBadInput.
int bad_input(const std::string& message);

// 1.23 B, 456.7 M, 12.3 K
std::string human_count(double n);
// 1.23 TB, 4.5 GB (decimal)
std::string human_bytes(double b);

// Writes a JSON object to stdout, indented, with a final newline.
void print_json(const nlohmann::json& j);

// Each subcommand registers its options and sets `run` to the function that executes it.
using Runner = std::function<int()>;
Runner add_inspect(CLI::App& app);
Runner add_validate(CLI::App& app);
Runner add_simulate(CLI::App& app);
Runner add_launch(CLI::App& app);
Runner add_plan(CLI::App& app);

}  // namespace moeplan::cli
