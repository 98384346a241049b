// moerun bench under mpiexec -n 2 (quick): every file it writes parses with a small reader of its format,
// values are positive and finite, and profile.json's gpu/node/scale_out load as a hardware profile would.
#include "executor/bench/bench.h"

#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "simulator/calibrate/sources.h"
#include "simulator/io/builtin_catalog.h"
#include "simulator/io/hardware_loader.h"

namespace moeplan::executor {
namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool positive(double v) {
  return std::isfinite(v) && v > 0;
}

// CSV with '#' comment lines: checks the header and returns the rows' last column (the figure).
std::vector<double> csv_figures(const std::string& text, const std::string& header, size_t columns) {
  std::istringstream in(text);
  std::vector<double> figures;
  bool seen_header = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (!seen_header) {
      CHECK(line == header);
      seen_header = true;
      continue;
    }
    std::vector<std::string> cells;
    std::stringstream cs(line);
    for (std::string cell; std::getline(cs, cell, ',');) cells.push_back(cell);
    CHECK(cells.size() == columns);
    figures.push_back(std::stod(cells.back()));
  }
  CHECK(seen_header);
  return figures;
}

struct NcclRow {
  long long bytes = 0, count = 0;
  double time[2] = {}, algbw[2] = {}, busbw[2] = {};
};

// nccl-tests text: '#' lines, then rows "size count type redop root (time algbw busbw #wrong) x 2".
std::vector<NcclRow> nccl_rows(const std::string& text, const std::string& collective, int ranks) {
  std::istringstream in(text);
  std::vector<NcclRow> rows;
  int rank_lines = 0;
  bool header = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#  Rank ", 0) == 0) ++rank_lines;
    if (line.find("#       size         count") == 0) header = true;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream cells(line);
    NcclRow r;
    std::string type, redop, wrong;
    int root = 0;
    cells >> r.bytes >> r.count >> type >> redop >> root;
    for (int i = 0; i < 2; ++i) cells >> r.time[i] >> r.algbw[i] >> r.busbw[i] >> wrong;
    CHECK(!cells.fail());
    CHECK(type == "float");
    CHECK(r.bytes == 4 * r.count);
    rows.push_back(r);
  }
  CHECK(text.rfind("# Collective test starting: " + collective + "_perf\n", 0) == 0);
  CHECK(text.find("# Avg bus bandwidth    : ") != std::string::npos);
  CHECK(rank_lines == ranks);
  CHECK(header);
  return rows;
}

}  // namespace

TEST_SUITE("executor.bench") {
  TEST_CASE("nccl-tests number formatting keeps the column widths") {
    CHECK(nccl_float(12.345, 7) == "  12.35");
    CHECK(nccl_float(123456.7, 7) == " 123457");
    CHECK(nccl_float(0.001, 6) == "1.0e-03");  // below 2 decimals: e-notation, not a zero
    CHECK(nccl_float(0.0, 6) == "  0.00");
    CHECK(busbw_factor("all_reduce", 4) == doctest::Approx(1.5));
    CHECK(busbw_factor("alltoall", 4) == doctest::Approx(0.75));
    CHECK(busbw_factor("sendrecv", 4) == 1.0);
  }

  TEST_CASE("a hot receiver's counts: every rank sends the same, rank 0 receives hot_factor times it") {
    for (int n : {2, 3, 4, 8}) {
      for (double hot : {1.0, 1.5, 2.0, 4.0, 9.0}) {
        for (int64_t values : {int64_t{1}, int64_t{7}, int64_t{1024}, int64_t{1} << 20}) {
          CAPTURE(n);
          CAPTURE(hot);
          CAPTURE(values);
          for (int me = 0; me < n; ++me) {
            const SkewCounts c = skew_counts(n, me, values, hot);
            int64_t sent = 0, received = 0;
            for (int64_t v : c.send) sent += v;
            for (int64_t v : c.recv) received += v;
            CHECK(sent == c.sent);
            CHECK(c.sent == values);
            // What a rank expects from each peer is what that peer sends it (all-to-all-v's contract).
            for (int p = 0; p < n; ++p) CHECK(c.recv[p] == skew_counts(n, p, values, hot).send[me]);
            if (me == 0) {
              CHECK(received == c.send[0] * n);
              CHECK(c.hot_factor ==
                    doctest::Approx(static_cast<double>(received) / static_cast<double>(c.sent)));
            }
            for (int p = 1; p < n; ++p) CHECK(c.send[p] == c.send[1]);  // the others evenly
            CHECK(c.hot_factor <= n + 1e-12);
            CHECK(c.hot_factor >= 1.0 - 1e-12);
          }
          // Rounding moves less than one value per peer to rank 0.
          const double want = std::min<double>(hot, n);
          CHECK(skew_counts(n, 0, values, hot).hot_factor >= want - 1e-12);
          CHECK(skew_counts(n, 0, values, hot).hot_factor <
                want + static_cast<double>(n * (n - 1)) / static_cast<double>(values));
        }
      }
    }
  }

  TEST_CASE("a plan's exchange is timed at the table's sizes and its own, uniform and at its load") {
    PlanExchange x{.size = 4, .stride = 2, .hot_factor = 1.3, .bytes = 10'001, .plan = "p.json"};
    using Row = std::pair<int64_t, double>;
    // Its own bytes rounded down to whole fp32 values, in order among the table's sizes.
    CHECK(
        plan_exchange_rows(x, {4096, 65536}, 1 << 20) ==
        std::vector<Row>{{4096, 1.0}, {4096, 1.3}, {10'000, 1.0}, {10'000, 1.3}, {65536, 1.0}, {65536, 1.3}});
    // Cut to the largest message; a size the table already has is timed once; a uniform plan once per size.
    CHECK(plan_exchange_rows(x, {4096}, 4096) == std::vector<Row>{{4096, 1.0}, {4096, 1.3}});
    x.hot_factor = 1.0;
    CHECK(plan_exchange_rows(x, {4096}, 1 << 20) == std::vector<Row>{{4096, 1.0}, {10'000, 1.0}});
    // 4 ranks 2 apart: world ranks 0, 2, 4 and 6, so a world of 7 holds it and one of 6 does not.
    for (int r = 0; r < 10; ++r) CHECK(in_plan_exchange(x, r) == (r % 2 == 0 && r < 8));
    CHECK(check_plan_exchange(x, 7).ok());
    const auto small = check_plan_exchange(x, 6);
    REQUIRE_FALSE(small.ok());
    CHECK(small.error().message ==
          "--plan p.json: its expert-parallel group (4 ranks, 2 apart) needs 7 ranks; this bench has 6");
    CHECK(check_plan_exchange(PlanExchange{}, 1).ok());  // none asked for
    CHECK(plan_exchange_note(x) ==
          "; then the expert-parallel group of plan p.json (4 ranks 2 apart from world rank 0) at its hot "
          "factor "
          "1 and its 10001 bytes per rank");
    CHECK(plan_exchange_note(PlanExchange{}).empty());
  }

  TEST_CASE("the GPU bench's sustained rate is measured and capped at 1 and loads as the profile's field") {
    // The H200 of 4 December: 786.9 TFLOP/s cool, 678.3 after a minute of GEMMs.
    const nlohmann::ordered_json e = sustained_rate_entry(786.9, 678.3, 10, 60, "G1");
    CHECK(e.at("value").get<double>() == doctest::Approx(678.3 / 786.9));
    CHECK(e.at("basis") == "measured");
    CHECK(e.at("range").at(0) == e.at("value"));
    CHECK(e.at("range").at(1).get<double>() == 1.0);
    CHECK(e.at("source").get<std::string>().starts_with("G1: sustained.csv"));
    // Noise may make the hot burst faster: the rate never exceeds the burst's.
    CHECK(sustained_rate_entry(700, 710, 10, 60, "G1").at("value").get<double>() == 1.0);
    CHECK(sustained_rate_entry(0, 710, 10, 60, "G1").is_null());
    CHECK(sustained_rate_entry(700, std::nan(""), 10, 60, "G1").is_null());
    // In a hardware profile it replaces the shipped assumption and loads.
    auto j = io::read_input("h100-sxm", "hwprofiles", "", nullptr, nullptr);
    REQUIRE(j.ok());
    nlohmann::json hw = j.value();
    hw["gpu"]["sustained_rate"]["bf16"] = nlohmann::json::parse(e.dump());
    auto loaded = io::hardware_from_json(hw, "profile.json");
    REQUIRE_MESSAGE(loaded.ok(), (loaded.ok() ? "" : loaded.error().message));
    const auto& rate = loaded.value().gpu.sustained_rate.at("bf16");
    CHECK(rate.basis == Basis::kMeasured);
    CHECK(rate.value == doctest::Approx(0.862).epsilon(1e-3));
    REQUIRE(rate.range);
    CHECK(rate.range->second == 1.0);
  }

  TEST_CASE("the quick bench writes every file in the formats calibrate reads") {
    int me = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    // One directory for the job: rank 0's pid.
    int pid = static_cast<int>(getpid());
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    const auto dir = std::filesystem::temp_directory_path() / ("moerun-bench-test-" + std::to_string(pid));
    BenchOptions options;
    options.out_dir = dir.string();
    options.quick = true;
    // A plan's exchange over the first two ranks at 1.25x the mean, 8 KiB per rank.
    options.plan_exchange = {.size = 2, .stride = 1, .hot_factor = 1.25, .bytes = 8192, .plan = "p.json"};
    auto result = run_bench(options, MPI_COMM_WORLD);
    REQUIRE(result.ok());
    const BenchSummary& s = result.value();
    CHECK(positive(s.best_gemm_tflops));
    CHECK(positive(s.triad_GBps));
    CHECK(positive(s.sendrecv_latency_us));
    CHECK(positive(s.sendrecv_bw_GBps));
    if (me != 0) return;

    const auto profile = nlohmann::json::parse(read_text(dir / "profile.json"));
    CHECK(profile["format"] == "moeplan-calibration-sources-v1");
    CHECK(profile["sources"]["B1"].get<std::string>().find("OpenMPI") != std::string::npos);
    // gpu, node and scale_out follow the hardware profile form exactly: the strict loader accepts them.
    nlohmann::json hw = {{"format", "moeplan-hwprofile-v1"},
                         {"name", profile["name"]},
                         {"description", profile["description"]},
                         {"sources", profile["sources"]},
                         {"gpu", profile["gpu"]},
                         {"node", profile["node"]},
                         {"scale_out", profile["scale_out"]}};
    auto loaded = io::hardware_from_json(hw, "profile.json");
    if (!loaded.ok()) FAIL_CHECK(loaded.error().message);
    CHECK(profile["node"]["gpus_per_node"]["value"] == n);

    std::vector<std::string> measured = profile["measurements"];
    CHECK(measured.size() == 5 + 5);  // 5 CSVs, 5 collectives at group size 2
    for (const std::string& f : measured) {
      CAPTURE(f);
      CHECK(std::filesystem::exists(dir / f));
      const std::string text = read_text(dir / f);
      std::vector<double> figures;
      if (f == "gemm.csv") figures = csv_figures(text, "m,n,k,dtype,tflops", 5);
      if (f == "grouped_gemm.csv")
        figures = csv_figures(text, "groups,m_per_group,n,k,dtype,kernel,tflops", 7);
      if (f == "attention.csv") {
        figures = csv_figures(text, "seq_len,head_dim,causal,direction,dtype,impl,tflops", 7);
      }
      if (f == "hbm.csv") {
        figures = csv_figures(text, "kernel,bw_GBps", 2);
        CHECK(text.find("\ntriad,") != std::string::npos);
        CHECK(text.find("\nmul,") != std::string::npos);
      }
      if (f == "alltoall_skew.csv") {
        // ranks,nodes,bytes,hot_factor,time_us: two sizes x hot factors 1, 1.5 and 2 (4 is above 2 ranks),
        // then the plan's exchange: the two sizes and its 8 KiB x hot factors 1 and 1.25.
        figures = csv_figures(text, "ranks,nodes,bytes,hot_factor,time_us", 5);
        CHECK(figures.size() == 2 * 3 + 3 * 2);
        CHECK(text.find("\n2,1,4096,1,") != std::string::npos);
        CHECK(text.find("\n2,1,4096,1.5,") != std::string::npos);
        CHECK(text.find("\n2,1,65536,2,") != std::string::npos);
        CHECK(text.find("\n2,1,8192,1,") != std::string::npos);
        CHECK(text.find("\n2,1,8192,1.25,") != std::string::npos);
        CHECK(text.find("\n2,1,65536,1.25,") != std::string::npos);
      }
      if (f.find("_perf.n") != std::string::npos) {
        const std::string collective = f.substr(0, f.find("_perf"));
        for (const NcclRow& r : nccl_rows(text, collective, n)) {
          figures.push_back(r.time[0]);
          figures.push_back(r.algbw[1] + 1e-9);  // tiny messages print 0.00 GB/s
        }
      }
      CHECK(!figures.empty());
      for (double v : figures) CHECK(positive(v));
    }
    // And `moeplan calibrate --bench DIR` turns the folder into a hardware profile whose tables hold it all.
    auto built = calibrate::build_profile(dir.string());
    if (!built.ok()) FAIL_CHECK(built.error().message);
    if (built.ok()) {
      auto cpu =
          io::hardware_from_json(nlohmann::json::parse(calibrate::profile_text(built.value())), "bench");
      REQUIRE(cpu.ok());
      CHECK(cpu.value().calibration.collectives.size() == 5);
      CHECK(!cpu.value().calibration.gemm.empty());
      CHECK(!cpu.value().calibration.attention.empty());
      CHECK(cpu.value().calibration.hbm.size() == 4);
      REQUIRE(cpu.value().calibration.alltoall_skew.size() == 1);
      const AllToAllSkewTable& skew = cpu.value().calibration.alltoall_skew[0];
      CHECK(skew.ranks == 2);
      CHECK(skew.nodes == 1);
      CHECK(skew.points.size() == 6 + 6);  // one table: the plan's group is the standard 2-rank one
      CHECK(skew.source.find("hot receiver") != std::string::npos);
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace moeplan::executor
