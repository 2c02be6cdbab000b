// Names of the nodes of a job (scheduler, servers, workers) as messages and logs write them.
#pragma once

#include <string>

#include "gradsync.pb.h"

namespace gradsync {

// "server 1 (127.0.0.1:40211)", "worker 3", "scheduler".
std::string NodeName(const wire::NodeInfo& node);
std::string RoleName(wire::Role role);

}  // namespace gradsync
