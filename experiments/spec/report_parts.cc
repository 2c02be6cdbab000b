// The report's parts (report.h's ReportPart), in the order of their sections: the one place that
// names them.
#include "experiments/spec/report.h"
#include "experiments/spec/tables_report.h"

namespace gradsync {

const std::vector<const ReportPart*>& ReportParts() {
  static const TablesReport tables;
  static const std::vector<const ReportPart*> parts = {&tables};
  return parts;
}

}  // namespace gradsync
