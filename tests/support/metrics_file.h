// A worker's metrics file (common/obs/metrics.h) as tests read it.
#pragma once

#include <string>
#include <vector>

namespace gradsync::testing {

// The training rows of the metrics file at `path` (whole rows of every column, neither the header
// nor evaluation rows, which fill test_loss), each split into its fields (SplitCsv); an unreadable
// file gives none.
std::vector<std::vector<std::string>> TrainingRows(const std::string& path);

}  // namespace gradsync::testing
