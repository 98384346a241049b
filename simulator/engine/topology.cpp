// Cluster topology graph and shortest paths (see topology.h).
#include "simulator/engine/topology.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <boost/graph/compressed_sparse_row_graph.hpp>

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
  // Built once from the edge list (both directions of each link), in compressed sparse rows: a 16,384-GPU
  // cluster has over 20,000 vertices and 50,000 links, which an adjacency list allocates one by one. Each
  // vertex's neighbours keep the order its links were added in (the rows are filled in input order).
  using Graph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, Link>;
  // A vertex's name, written out only for the vertices of a path asked for.
  enum class Role : uint8_t { kGpu, kNvswitch, kLeaf, kSpine, kNic };
  struct Name {
    Role role;
    int64_t a, b;  // GPU or node index; rail and leaf, or node and NIC
  };
  Graph g;
  std::vector<Name> names;
  std::vector<std::pair<size_t, size_t>> ends;  // until the graph is built
  std::vector<Link> links;
  int64_t gpus = 0;

  size_t add(Role role, int64_t a = 0, int64_t b = 0) {
    names.push_back({role, a, b});
    return names.size() - 1;
  }
  void link(size_t u, size_t v, Link l) {
    ends.emplace_back(u, v);
    ends.emplace_back(v, u);
    links.push_back(l);
    links.push_back(l);
  }
  void build() {
    g = Graph(boost::edges_are_unsorted_multi_pass, ends.begin(), ends.end(), links.begin(), names.size());
    ends = std::vector<std::pair<size_t, size_t>>();  // freed (`= {}` would keep the buffers)
    links = std::vector<Link>();
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
    t.link(static_cast<size_t>(i), nvswitch[static_cast<size_t>(n)], Link{LinkKind::kNvlink, nvlink});
  }
  for (int64_t n = 0; n < nodes; ++n) {
    for (int64_t r = 0; r < rails; ++r) {
      // The NIC of rail r hangs off the node's GPU r * per_node / rails (one NIC per GPU on HGX boards).
      const size_t nic_v = t.add(Impl::Role::kNic, n, r);
      const int64_t owner = n * per_node + r * per_node / rails;
      if (owner < gpus) t.link(static_cast<size_t>(owner), nic_v, Link{LinkKind::kNic, nic});
      t.link(nic_v, leaf[static_cast<size_t>(r * leaves + n / nodes_per_leaf)], Link{LinkKind::kFabric, nic});
    }
  }
  if (leaves > 1) {
    // Non-blocking fat tree: each leaf's uplinks carry what its downlinks do.
    for (size_t l : leaf) {
      t.link(l, spine, Link{LinkKind::kFabric, nic * static_cast<double>(nodes_per_leaf)});
    }
  }
  t.build();
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
  using Edge = Impl::Graph::edge_descriptor;
  // Breadth-first from gpu_a until gpu_b is reached (neighbours in the order their links were added), so a
  // path between neighbours does not visit the whole cluster; each vertex remembers the link it was
  // reached by.
  const size_t n = boost::num_vertices(t.g);
  std::vector<uint8_t> seen(n, 0);
  std::vector<Edge> via(n);
  const auto src = static_cast<Vertex>(gpu_a), dst = static_cast<Vertex>(gpu_b);
  seen[src] = 1;
  std::vector<Vertex> frontier{src};
  for (size_t head = 0; head < frontier.size() && !seen[dst]; ++head) {
    for (auto [it, end] = boost::out_edges(frontier[head], t.g); it != end; ++it) {
      const Vertex v = boost::target(*it, t.g);
      if (seen[v]) continue;
      seen[v] = 1;
      via[v] = *it;
      frontier.push_back(v);
    }
  }
  MOEPLAN_ASSERT(seen[dst]);  // connected
  std::vector<Vertex> chain{dst};
  std::vector<Link> links;
  for (Vertex v = dst; v != src; v = boost::source(via[v], t.g)) {
    links.push_back(t.g[via[v]]);
    chain.push_back(boost::source(via[v], t.g));
  }
  Path p;
  for (auto v = chain.rbegin(); v != chain.rend(); ++v) p.hops.push_back(t.name(*v));
  p.links.assign(links.rbegin(), links.rend());
  return p;
}

}  // namespace moeplan::engine
