// One run's ops by stream: each stream's ops in program order, where each op sits, and a signature that two
// runs' versions of one op share (cost fields, layer and chunk) and that tells other ops apart.
#include <doctest/doctest.h>

#include "simulator/cost/cost_cache.h"
#include "simulator/predict/stream_index.h"

using namespace moeplan;

namespace {

Op op_at(int32_t id, int16_t stage, Stream stream, int32_t layer, double bytes) {
  Op op;
  op.id = id;
  op.stage = stage;
  op.stream = stream;
  op.layer = layer;
  op.hbm_bytes = bytes;
  return op;
}

}  // namespace

TEST_SUITE("predict") {
  TEST_CASE(
      "a stream index lists each stream's ops in id order and signs ops by cost fields, layer and chunk") {
    OpGraph g;
    g.num_stages = 2;
    g.ops = {op_at(0, 1, Stream::kCompute, 3, 1e6), op_at(1, 0, Stream::kCompute, 0, 1e6),
             op_at(2, 1, Stream::kCompute, 3, 1e6), op_at(3, 1, Stream::kComm, 3, 2e6),
             op_at(4, 0, Stream::kCompute, 1, 1e6), op_at(5, 1, Stream::kCompute, 4, 1e6)};
    g.ops[5].chunk = 1;
    std::vector<uint64_t> keys{1, 2, 3};  // replaced
    const StreamIndex x = StreamIndex::with_keys(g, keys);
    REQUIRE(x.queues() == 2 * static_cast<size_t>(kNumStreams));
    const auto compute = static_cast<size_t>(Stream::kCompute), comm = static_cast<size_t>(Stream::kComm);
    auto ids = [&](size_t q) {
      const auto s = x.of(q);
      return std::vector<int32_t>(s.begin(), s.end());
    };
    CHECK(ids(compute) == std::vector<int32_t>{1, 4});
    CHECK(ids(kNumStreams + compute) == std::vector<int32_t>{0, 2, 5});
    CHECK(ids(kNumStreams + comm) == std::vector<int32_t>{3});
    size_t listed = 0;
    for (size_t q = 0; q < x.queues(); ++q) listed += x.of(q).size();
    CHECK(listed == g.ops.size());
    // Each op is where queue and pos say.
    for (const Op& op : g.ops) {
      const auto i = static_cast<size_t>(op.id);
      CHECK(x.queue[i] == static_cast<uint32_t>(op.stage) * kNumStreams + static_cast<uint32_t>(op.stream));
      CHECK(x.of(x.queue[i])[x.pos[i]] == op.id);
    }
    // Keys computed where none were given, and kept.
    REQUIRE(keys.size() == g.ops.size());
    for (const Op& op : g.ops) CHECK(keys[static_cast<size_t>(op.id)] == cost::cost_fields_hash(op));
    CHECK(x.sig[0] == x.sig[2]);  // same cost fields, layer and chunk
    CHECK(x.sig[0] != x.sig[1]);  // another layer
    CHECK(x.sig[0] != x.sig[3]);  // another size
    CHECK(x.sig[1] != x.sig[4]);  // another layer
    g.ops[5].chunk = 0;
    g.ops[5].layer = 3;
    CHECK(StreamIndex(g, {}).sig[5] == x.sig[0]);  // chunk and layer were all that told them apart
    // Keys given are used as they are (a caller's cost keys).
    const std::vector<uint64_t> given(g.ops.size(), 7);
    const StreamIndex y(g, given);
    CHECK(y.sig[0] == y.sig[3]);  // their sizes differ only in the keys they were given
    // Built with the keys or from them: the same index.
    const StreamIndex z(g, keys);
    CHECK(z.sig == StreamIndex(g, {}).sig);
    CHECK(z.ops == StreamIndex(g, {}).ops);
  }
}
