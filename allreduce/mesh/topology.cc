#include "allreduce/mesh/topology.h"

#include <algorithm>
#include <thread>

#include "allreduce/plan/algorithm.h"
#include "common/base/host_port.h"

namespace gradsync {

Status MeshTopology::Set(int rank, const std::vector<std::string>& peers) {
  rank_ = rank;
  size_ = static_cast<int>(peers.size());
  peers_ = peers;
  if (size_ < 1 || rank < 0 || rank >= size_) return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(size_));
  if (size_ > 1) GroupHosts();
  return OkStatus();
}

// The hosts, by the host part of the ranks' addresses: each host's ranks in rank order (its
// leader first). Auto's choice looks at this host's ranks against its cores.
void MeshTopology::GroupHosts() {
  hosts_.clear();
  std::vector<std::string> names;
  std::string host;
  uint16_t port = 0;
  for (int i = 0; i < size_; ++i) {
    if (!ParseHostPort(peers_[i], &host, &port).ok()) host = peers_[i];
    auto at = std::find(names.begin(), names.end(), host);
    if (at == names.end()) {
      names.push_back(host);
      hosts_.push_back({i});
    } else {
      hosts_[static_cast<size_t>(at - names.begin())].push_back(i);
    }
  }
  for (size_t g = 0; g < hosts_.size(); ++g) {
    if (std::find(hosts_[g].begin(), hosts_[g].end(), rank_) != hosts_[g].end()) my_host_ = static_cast<int>(g);
  }
  oversubscribed_ = Oversubscribed(hosts_[static_cast<size_t>(my_host_)].size(), std::thread::hardware_concurrency());
}

}  // namespace gradsync
