// Shared pieces of the `moerun` subcommands (run, bench): exit codes, the rank that prints, and the
// registration of each subcommand's options.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace moeplan::executor::cli {

// DESIGN.md: 0 success; 2 bad input or arguments; 3 a plan that cannot run; anything else is a bug.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInfeasible = 3;

// Each subcommand registers its options on its CLI11 subcommand and returns the function that executes it,
// called after MPI_Init with this process's world rank and the world size.
using Runner = std::function<int(int world_rank, int world_size)>;
Runner add_run(CLI::App& app);
Runner add_bench(CLI::App& app);

// Prints "moerun: <message>" as one line on stderr from world rank 0 only; returns kExitBadInput.
int bad_input(int world_rank, const std::string& message);

}  // namespace moeplan::executor::cli
