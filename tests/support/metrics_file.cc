#include "tests/support/metrics_file.h"

#include <fstream>

#include "common/obs/metrics.h"

namespace gradsync::testing {

std::vector<std::vector<std::string>> TrainingRows(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> v = SplitCsv(line);
    if (v.size() != kMetricsColumns || v[kColRun] == "run" || !v[kColTestLoss].empty()) continue;
    rows.push_back(std::move(v));
  }
  return rows;
}

}  // namespace gradsync::testing
