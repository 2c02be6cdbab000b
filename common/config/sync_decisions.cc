#include "common/config/sync_decisions.h"

namespace gradsync {

bool PsOverlaps(const OverlapFacts& f) {
  return f.requested && !f.compressed && !f.sparse && !f.on_device && f.per_tensor_params && !f.straggles && !f.rounds;
}

bool PsOverlapRefused(const OverlapFacts& f) { return f.requested && !f.rounds && !PsOverlaps(f); }

bool AllreduceOverlaps(const OverlapFacts& f) {
  return f.requested && !f.compressed && !f.sparse && !f.on_device && f.workers > 1 && !f.rounds && f.zero != 1;
}

int RowCacheBound(bool requested, const std::string& mode, int staleness) {
  return requested && mode == "ssp" && staleness >= 1 ? staleness : -1;
}

}  // namespace gradsync
