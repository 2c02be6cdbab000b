#include "allreduce/mesh/links.h"

#include <algorithm>

#include "allreduce/mesh/topology.h"
#include "allreduce/plan/algorithm.h"

namespace gradsync {

std::vector<int> MeshLinks::Plan(const MeshTopology& topology, int* mesh_down) {
  const int rank = topology.rank(), size = topology.size();
  left_peer_ = topology.left();
  right_peer_ = topology.right();
  std::vector<int> mesh_up;
  *mesh_down = 0;
  mesh_.clear();
  mesh_.resize(static_cast<size_t>(size));
  if (size <= 2) return mesh_up;
  std::vector<int> pairs = MeshPeers(rank, size);
  // Spanning hosts with several ranks on one: the leaders' ring of the hierarchical all-reduce.
  std::vector<int> leaders;
  for (const auto& h : topology.hosts()) leaders.push_back(h.front());
  const bool may_nest = leaders.size() > 1 && leaders.size() < static_cast<size_t>(size);
  if (auto at = std::find(leaders.begin(), leaders.end(), rank); may_nest && at != leaders.end()) {
    const size_t i = static_cast<size_t>(at - leaders.begin()), l = leaders.size();
    for (int p : {leaders[(i + 1) % l], leaders[(i + l - 1) % l]}) {
      if (std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p);
    }
  }
  for (int p : pairs) {
    mesh_[static_cast<size_t>(p)] = std::make_unique<Link>(io_);
    if (p > rank) mesh_up.push_back(p);
    else ++*mesh_down;
  }
  return mesh_up;
}

bool MeshLinks::AllReady() const {
  if (!left_.ready || !right_.ready) return false;
  for (const auto& link : mesh_) {
    if (link && !link->ready) return false;
  }
  return true;
}

std::string MeshLinks::MissingMesh() const {
  std::string missing;
  for (size_t p = 0; p < mesh_.size(); ++p) {
    if (mesh_[p] && !mesh_[p]->ready) missing += " " + std::to_string(p);
  }
  return missing;
}

void MeshLinks::CloseAll() {
  boost::system::error_code ec;
  for (Link* link : {&left_, &right_}) {
    link->socket.close(ec);
    link->stream.Reset();
  }
  for (auto& link : mesh_) {
    if (!link) continue;
    link->socket.close(ec);
    link->stream.Reset();
  }
}

uint64_t MeshLinks::overhead_sent() const {
  uint64_t overhead = right_.stream.overhead_sent();
  for (const auto& link : mesh_) overhead += link ? link->stream.overhead_sent() : 0;
  return overhead;
}

uint64_t MeshLinks::overhead_received() const {
  uint64_t overhead = left_.stream.overhead_received();
  for (const auto& link : mesh_) overhead += link ? link->stream.overhead_received() : 0;
  return overhead;
}

}  // namespace gradsync
