// MeshTopology: who is where in one job's collective: this rank, every rank's address, its ring
// neighbours, and the hosts (each host's ranks by the host part of their addresses, this rank's
// host, and whether that host runs more ranks than it has cores, which auto's choice and
// --overlap's default look at). Set once by PeerMesh::Connect; everything else reads it.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

class MeshTopology {
 public:
  // peers[i] = "host:port" of rank i. kInvalidArgument for a rank out of range; the hosts are
  // grouped when there is more than one rank.
  Status Set(int rank, const std::vector<std::string>& peers);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int right() const { return (rank_ + 1) % size_; }
  int left() const { return (rank_ - 1 + size_) % size_; }
  const std::vector<std::string>& peers() const { return peers_; }
  const std::string& address(int r) const { return peers_[static_cast<size_t>(r)]; }
  // Each host's ranks in rank order (its leader first); empty for a single rank.
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  int host_count() const { return static_cast<int>(hosts_.size()); }
  int my_host() const { return my_host_; }
  // The ranks on this rank's host.
  int host_ranks() const { return hosts_.empty() ? size_ : static_cast<int>(hosts_[static_cast<size_t>(my_host_)].size()); }
  bool oversubscribed() const { return oversubscribed_; }

 private:
  void GroupHosts();

  int rank_ = -1;
  int size_ = 0;
  std::vector<std::string> peers_;
  std::vector<std::vector<int>> hosts_;  // each host's ranks, in rank order
  int my_host_ = 0;
  bool oversubscribed_ = false;  // more ranks on this host than cores (auto's choice)
};

}  // namespace gradsync
