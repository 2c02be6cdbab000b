#include "common/net/control/node.h"

namespace gradsync {

std::string RoleName(wire::Role role) {
  switch (role) {
    case wire::SCHEDULER: return "scheduler";
    case wire::SERVER: return "server";
    case wire::WORKER: return "worker";
    default: return "node";
  }
}

std::string NodeName(const wire::NodeInfo& node) {
  std::string s = RoleName(node.role());
  if (node.role() == wire::SCHEDULER) return s;
  if (node.rank() >= 0) s += " " + std::to_string(node.rank());
  if (node.standby()) s += " (standby)";
  if (!node.host().empty()) {
    s += " (" + node.host();
    if (node.port()) s += ":" + std::to_string(node.port());
    s += ")";
  }
  return s;
}

}  // namespace gradsync
