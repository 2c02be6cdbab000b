// The checks of the embedding tables' and the click log's settings (--model=dlrm): their sizes,
// the tables' settings outside dlrm, and what tables do not go with yet. Part of Validate.
#pragma once

#include "common/config/checks/config_checks.h"

namespace gradsync::config_checks {

void CheckTables(const config::TrainConfig& c, const Traits& t, Checker& k);

}  // namespace gradsync::config_checks
