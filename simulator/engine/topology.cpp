// Cluster topology graph and shortest paths (see topology.h).
#include "simulator/engine/topology.h"

#include <algorithm>
#include <deque>
#include <limits>

#include <fmt/format.h>
#include <boost/graph/adjacency_list.hpp>

#include "simulator/core/status.h"

namespace moeplan::engine {

double Path::bottleneck_bytes_per_s() const {
  double b = std::numeric_limits<double>::infinity();
  for (const Link& l : links) b = std::min(b, l.bytes_per_s);
  return b;
}

bool Path::crosses_nodes() const {
  return std::any_of(links.begin(), links.end(), [](const Link& l) { return l.kind != LinkKind::kNvlink; });
}

struct Topology::Impl {
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, boost::no_property, Link>;
  // A vertex's name, written out only for the vertices of a path asked for (a 16,384-GPU cluster has over
  // 20,000 vertices).
  enum class Role : uint8_t { kGpu, kNvswitch, kLeaf, kSpine, kNic };
  struct Name {
    Role role;
    int64_t a, b;  // GPU or node index; rail and leaf, or node and NIC
  };
  Graph g;
  std::vector<Name> names;
  int64_t gpus = 0;

  size_t add(Role role, int64_t a = 0, int64_t b = 0) {
    names.push_back({role, a, b});
    return boost::add_vertex(g);
  }
  std::string name(size_t v) const {
    const Name& n = names[v];
    switch (n.role) {
      case Role::kGpu:
        return fmt::format("gpu{}", n.a);
      case Role::kNvswitch:
        return fmt::format("node{}.nvswitch", n.a);
      case Role::kLeaf:
        return fmt::format("rail{}.leaf{}", n.a, n.b);
      case Role::kSpine:
        return "spine";
      case Role::kNic:
        return fmt::format("node{}.nic{}", n.a, n.b);
    }
    return {};
  }
};

Topology::Topology(const HardwareProfile& hw, int64_t gpus, int64_t leaf_ports) : impl_(new Impl) {
  auto& t = *impl_;
  const int64_t per_node = hw.node.gpus_per_node.value;
  const int64_t nodes = (gpus + per_node - 1) / per_node;
  const int64_t rails = std::max<int64_t>(1, hw.scale_out.nics_per_node.value);
  const int64_t nodes_per_leaf = std::max<int64_t>(1, leaf_ports / 2);
  const int64_t leaves = (nodes + nodes_per_leaf - 1) / nodes_per_leaf;
  const double nvlink = hw.node.nvlink_bw_achieved_bytes_per_s.value;
  const double nic = hw.scale_out.nic_bw_achieved_bytes_per_s.value;
  t.gpus = gpus;
  // GPUs first so that vertex i is GPU i.
  for (int64_t i = 0; i < gpus; ++i) t.add(Impl::Role::kGpu, i);
  std::vector<size_t> nvswitch(static_cast<size_t>(nodes));
  for (int64_t n = 0; n < nodes; ++n) nvswitch[static_cast<size_t>(n)] = t.add(Impl::Role::kNvswitch, n);
  std::vector<size_t> leaf(static_cast<size_t>(rails * leaves));
  for (int64_t r = 0; r < rails; ++r) {
    for (int64_t l = 0; l < leaves; ++l)
      leaf[static_cast<size_t>(r * leaves + l)] = t.add(Impl::Role::kLeaf, r, l);
  }
  const size_t spine = leaves > 1 ? t.add(Impl::Role::kSpine) : 0;
  for (int64_t i = 0; i < gpus; ++i) {
    const int64_t n = i / per_node;
    boost::add_edge(static_cast<size_t>(i), nvswitch[static_cast<size_t>(n)], Link{LinkKind::kNvlink, nvlink},
                    t.g);
  }
  for (int64_t n = 0; n < nodes; ++n) {
    for (int64_t r = 0; r < rails; ++r) {
      // The NIC of rail r hangs off the node's GPU r * per_node / rails (one NIC per GPU on HGX boards).
      const size_t nic_v = t.add(Impl::Role::kNic, n, r);
      const int64_t owner = n * per_node + r * per_node / rails;
      if (owner < gpus) boost::add_edge(static_cast<size_t>(owner), nic_v, Link{LinkKind::kNic, nic}, t.g);
      boost::add_edge(nic_v, leaf[static_cast<size_t>(r * leaves + n / nodes_per_leaf)],
                      Link{LinkKind::kFabric, nic}, t.g);
    }
  }
  if (leaves > 1) {
    // Non-blocking fat tree: each leaf's uplinks carry what its downlinks do.
    for (size_t l : leaf) {
      boost::add_edge(l, spine, Link{LinkKind::kFabric, nic * static_cast<double>(nodes_per_leaf)}, t.g);
    }
  }
}

Topology::~Topology() {
  delete impl_;
}

int64_t Topology::num_vertices() const {
  return static_cast<int64_t>(boost::num_vertices(impl_->g));
}

Path Topology::path(int64_t gpu_a, int64_t gpu_b) const {
  const auto& t = *impl_;
  MOEPLAN_ASSERT(gpu_a >= 0 && gpu_a < t.gpus && gpu_b >= 0 && gpu_b < t.gpus);
  using Vertex = Impl::Graph::vertex_descriptor;
  // Breadth-first from gpu_a until gpu_b is reached (neighbours in edge order, as Boost's search visits
  // them), so a path between neighbours does not visit the whole cluster.
  constexpr Vertex kUnseen = std::numeric_limits<Vertex>::max();
  std::vector<Vertex> pred(boost::num_vertices(t.g), kUnseen);
  const auto src = static_cast<Vertex>(gpu_a), dst = static_cast<Vertex>(gpu_b);
  pred[src] = src;
  std::deque<Vertex> frontier{src};
  while (!frontier.empty() && pred[dst] == kUnseen) {
    const Vertex u = frontier.front();
    frontier.pop_front();
    for (auto [it, end] = boost::adjacent_vertices(u, t.g); it != end; ++it) {
      if (pred[*it] != kUnseen) continue;
      pred[*it] = u;
      frontier.push_back(*it);
    }
  }
  Path p;
  std::vector<Vertex> chain;
  for (Vertex v = dst; v != src; v = pred[v]) {
    MOEPLAN_ASSERT(pred[v] != kUnseen);  // connected
    chain.push_back(v);
  }
  chain.push_back(src);
  std::reverse(chain.begin(), chain.end());
  for (size_t i = 0; i < chain.size(); ++i) {
    p.hops.push_back(t.name(chain[i]));
    if (i + 1 < chain.size()) p.links.push_back(t.g[boost::edge(chain[i], chain[i + 1], t.g).first]);
  }
  return p;
}

}  // namespace moeplan::engine
