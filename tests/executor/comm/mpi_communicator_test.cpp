// MpiCommunicator under mpiexec: every collective against closed forms computed locally from deterministic
// per-rank inputs (odd sizes, sizes not divisible by 128, zero length, uneven all-to-all counts with zeros),
// every wire format within its stated error bound (and visibly lossy), send/recv, and two threads on two
// communicators.
#include "executor/comm/mpi_communicator.h"

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "executor/comm/wire_format.h"

namespace moeplan::executor {
namespace {

constexpr WireFormat kWires[] = {WireFormat::kFp32, WireFormat::kBf16, WireFormat::kFp8E4m3};

// Rank r's value i: not representable in bf16 or e4m3, magnitudes spread over a few binades.
float input(int r, int64_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i + 1) + 1.3 * (r + 1)) * (1.0 + 0.5 * r) +
                            1e-3 * static_cast<double>(i % 7));
}

std::vector<float> inputs(int r, int64_t n, int64_t offset = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = input(r, offset + i);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// What all_reduce must return: zero-padded chunks of ceil(n / p), each rank's chunk rounded to the wire,
// summed in fp32 in rank order, the sum rounded to the wire again (the all-gather leg).
std::vector<float> all_reduce_model(int p, int64_t n, WireFormat wire) {
  const int64_t chunk = (n + p - 1) / p;
  std::vector<float> sum(static_cast<size_t>(chunk * p), 0.0f);
  for (int r = 0; r < p; ++r) {
    std::vector<float> x = inputs(r, n);
    x.resize(static_cast<size_t>(chunk * p), 0.0f);
    for (int c = 0; c < p; ++c) round_trip(wire, std::span(x).subspan(static_cast<size_t>(c * chunk), chunk));
    for (size_t i = 0; i < x.size(); ++i) sum[i] = r == 0 ? x[i] : sum[i] + x[i];
  }
  for (int c = 0; c < p; ++c) round_trip(wire, std::span(sum).subspan(static_cast<size_t>(c * chunk), chunk));
  sum.resize(static_cast<size_t>(n));
  return sum;
}

}  // namespace

TEST_SUITE("executor.comm.mpi") {
  TEST_CASE("all_reduce equals the rank-order fp32 sum bit for bit on every rank and size") {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const int p = world.size();
    for (int64_t n : {0, 1, 7, 127, 128, 129, 1000, 4099}) {
      for (WireFormat wire : kWires) {
        CAPTURE(n);
        CAPTURE(name_of(wire));
        std::vector<float> x = inputs(world.rank(), n);
        world.all_reduce(x, wire);
        CHECK(same_bits(x, all_reduce_model(p, n, wire)));
      }
    }
  }

  TEST_CASE("compressed all_reduce stays within its error bound and differs from fp32") {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const int p = world.size();
    const int64_t n = 1000;
    std::vector<float> exact32 = inputs(world.rank(), n);
    world.all_reduce(exact32, WireFormat::kFp32);
    for (WireFormat wire : {WireFormat::kBf16, WireFormat::kFp8E4m3}) {
      CAPTURE(name_of(wire));
      std::vector<float> x = inputs(world.rank(), n);
      world.all_reduce(x, wire);
      const double u = relative_error_bound(wire);
      // Per input value u |x_r| (+ the e4m3 subnormal floor 2^-10 amax / 448 per rounding), and u |sum| for
      // the all-gather leg; fp32 additions add at most p 2^-24 sum |x_r|.
      double amax = 0.0;
      for (int r = 0; r < p; ++r) {
        for (float v : inputs(r, n)) amax = std::max(amax, std::fabs(static_cast<double>(v)));
      }
      const double floor = wire == WireFormat::kFp8E4m3
                               ? kE4m3SubnormalAbsError * 2.0 * p * amax / static_cast<double>(kE4m3Max)
                               : 0.0;
      int differs = 0;
      for (int64_t i = 0; i < n; ++i) {
        double exact = 0.0, abs_sum = 0.0;
        for (int r = 0; r < p; ++r) {
          exact += static_cast<double>(input(r, i));
          abs_sum += std::fabs(static_cast<double>(input(r, i)));
        }
        const double bound =
            u * abs_sum + u * (std::fabs(exact) + u * abs_sum) + floor + (p + 1) * 0x1p-23 * abs_sum;
        CHECK(std::fabs(static_cast<double>(x[static_cast<size_t>(i)]) - exact) <= bound);
        differs += x[static_cast<size_t>(i)] != exact32[static_cast<size_t>(i)];
      }
      CHECK(differs > n / 2);
    }
  }

  TEST_CASE("all_gather places every rank's rounded input at its offset") {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const int p = world.size();
    for (int64_t n : {0, 1, 129, 300}) {
      for (WireFormat wire : kWires) {
        CAPTURE(n);
        CAPTURE(name_of(wire));
        const std::vector<float> in = inputs(world.rank(), n);
        std::vector<float> out(static_cast<size_t>(n * p), -1.0f);
        world.all_gather(in, out, wire);
        std::vector<float> expected;
        for (int r = 0; r < p; ++r) {
          std::vector<float> x = inputs(r, n);
          round_trip(wire, x);
          expected.insert(expected.end(), x.begin(), x.end());
        }
        CHECK(same_bits(out, expected));
      }
    }
  }

  TEST_CASE("reduce_scatter sums every rank's chunk for this rank in rank order") {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const int p = world.size(), me = world.rank();
    for (int64_t chunk : {0, 1, 130, 257}) {
      for (WireFormat wire : kWires) {
        CAPTURE(chunk);
        CAPTURE(name_of(wire));
        const std::vector<float> in = inputs(me, chunk * p);
        std::vector<float> out(static_cast<size_t>(chunk));
        world.reduce_scatter(in, out, wire);
        std::vector<float> expected(static_cast<size_t>(chunk), 0.0f);
        for (int r = 0; r < p; ++r) {
          std::vector<float> x = inputs(r, chunk, me * chunk);  // rank r's chunk for me
          round_trip(wire, x);
          for (size_t i = 0; i < x.size(); ++i) expected[i] = r == 0 ? x[i] : expected[i] + x[i];
        }
        CHECK(same_bits(out, expected));
      }
    }
  }

  TEST_CASE("all_to_all_v moves uneven segments including empty ones") {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const int p = world.size(), me = world.rank();
    // Rank r sends count(r, q) values to q: 0, 45, 90 or 135 (not multiples of 128); value j is input(r, 1000
    // q + j).
    auto count = [](int r, int q) { return static_cast<int64_t>(((3 * r + 5 * q) % 4) * 45); };
    for (WireFormat wire : kWires) {
      CAPTURE(name_of(wire));
      std::vector<int64_t> send_counts, recv_counts;
      std::vector<float> in;
      for (int q = 0; q < p; ++q) {
        send_counts.push_back(count(me, q));
        recv_counts.push_back(count(q, me));
        const std::vector<float> seg = inputs(me, count(me, q), 1000 * q);
        in.insert(in.end(), seg.begin(), seg.end());
      }
      std::vector<float> expected;
      for (int q = 0; q < p; ++q) {
        std::vector<float> seg = inputs(q, count(q, me), 1000 * me);
        round_trip(wire, seg);
        expected.insert(expected.end(), seg.begin(), seg.end());
      }
      std::vector<float> out(expected.size(), -1.0f);
      world.all_to_all_v(in, send_counts, out, recv_counts, wire);
      CHECK(same_bits(out, expected));
    }
  }

  TEST_CASE("send and recv around a ring deliver the rounded payload") {
    MpiCommunicator world(MPI_COMM_WORLD, "world");
    const int p = world.size(), me = world.rank();
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    for (WireFormat wire : kWires) {
      CAPTURE(name_of(wire));
      const std::vector<float> mine = inputs(me, 333);
      std::vector<float> got(333);
      if (me % 2 == 0) {
        world.send(mine, next, 7, wire);
        world.recv(got, prev, 7, wire);
      } else {
        world.recv(got, prev, 7, wire);
        world.send(mine, next, 7, wire);
      }
      std::vector<float> expected = inputs(prev, 333);
      round_trip(wire, expected);
      CHECK(same_bits(got, expected));
      CHECK((wire == WireFormat::kFp32) == same_bits(got, inputs(prev, 333)));
    }
    world.barrier();
  }

  TEST_CASE("two threads run collectives on two communicators at once") {
    MPI_Comm a = MPI_COMM_NULL, b = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &a);
    MPI_Comm_dup(MPI_COMM_WORLD, &b);
    MpiCommunicator ca(a, "a"), cb(b, "b");
    const int p = ca.size(), me = ca.rank();
    int bad_a = 0, bad_b = 0;
    std::thread ta([&] {
      for (int it = 0; it < 40; ++it) {
        std::vector<float> x = inputs(me, 257);
        ca.all_reduce(x, WireFormat::kBf16);
        bad_a += !same_bits(x, all_reduce_model(p, 257, WireFormat::kBf16));
      }
    });
    std::thread tb([&] {
      for (int it = 0; it < 40; ++it) {
        const std::vector<float> in = inputs(me, 100, it);
        std::vector<float> out(static_cast<size_t>(100 * p));
        cb.all_gather(in, out, WireFormat::kFp32);
        for (int r = 0; r < p; ++r) {
          bad_b += std::memcmp(out.data() + 100 * r, inputs(r, 100, it).data(), 400) != 0;
        }
      }
    });
    ta.join();
    tb.join();
    CHECK(bad_a == 0);
    CHECK(bad_b == 0);
  }

  TEST_CASE("init_mpi reports the thread level moerun needs") {
    int provided = 0;
    MPI_Query_thread(&provided);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    CHECK(init_mpi(nullptr, nullptr).ok());  // already initialised: only checks
  }
}

}  // namespace moeplan::executor
