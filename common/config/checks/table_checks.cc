#include "common/config/checks/table_checks.h"

#include <cstdint>
#include <string>

#include "common/optim/row_optimizer.h"

namespace gradsync::config_checks {

// Embedding tables (dlrm's, sparse_logreg's weights) and the click log: their sizes, and what does
// not combine with tables yet.
void CheckTables(const config::TrainConfig& c, const Traits& t, Checker& k) {
  if (c.click_features() < 1 || c.click_features() > 1024)
    k.Add("click_features", "{click_features} must be in [1, 1024]");
  if (c.click_ids() < 0 || c.click_ids() > (int64_t{1} << 62))
    k.Add("click_ids", "{click_ids} must be in [0, 2^62] (0: any 64-bit id)");
  if (!(c.click_zipf() > 0 && c.click_zipf() <= 3))
    k.Add("click_zipf", "{click_zipf} must be in (0, 3]");
  if (c.click_dense() < 1 || c.click_dense() > 1024)
    k.Add("click_dense", "{click_dense} must be in [1, 1024]");
  if (c.click_train() < 1 || c.click_train() > (int64_t{1} << 32))
    k.Add("click_train", "{click_train} must be in [1, 2^32]");
  if (c.click_test() < 1 || c.click_test() > (int64_t{1} << 24))
    k.Add("click_test", "{click_test} must be in [1, 2^24]");
  if (!(c.click_planted() >= 0 && c.click_planted() <= 10))
    k.Add("click_planted", "{click_planted} must be in [0, 10]");
  if (c.table_dim() < 1 || c.table_dim() > 4096)
    k.Add("table_dim", "{table_dim} must be in [1, 4096]");
  if (!ParseRowOptimizerKind(c.table_optimizer()).ok()) {
    k.Add("table_optimizer", "{table_optimizer} must be sgd, adagrad or adam, not '",
          c.table_optimizer() + "'");
  }
  if (c.table_rows() < 1 || c.table_rows() > (int64_t{1} << 31)) {
    k.Add("table_rows", "{table_rows} must be in [1, 2^31]");
  }
  if (!t.table_model) {
    for (const char* f : {"table_dim", "table_optimizer", "table_rows"}) {
      if (Has(c, f)) k.Add(f, std::string("{") + f + "} applies to {model=dlrm}");
    }
  }
  if (!t.keyed) return;
  // The models with tables (dlrm's, sparse_logreg's weights): what the dense models only take is
  // refused by its own check (Traits::keyed); tables do not go with the overlapped push or
  // all-reduce yet, nor with all-reduce's checkpoints (which hold the dense parameters, not the
  // workers' replicas of the tables).
  const std::string model = "{model=" + c.model() + "}";
  if (c.overlap()) k.Add("overlap", "{overlap} applies to the dense models, not " + model);
  if (t.allreduce && (c.has_checkpoint_dir() || c.resume())) {
    k.Add(c.resume() ? "resume" : "checkpoint_dir", "all-reduce checkpoints do not carry " + model + "'s tables yet");
  }
}

}  // namespace gradsync::config_checks
