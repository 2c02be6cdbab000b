// Per-step metrics rows and the CSV file each worker writes (ARCHITECTURE.md, Outputs, defines
// every column).
//
// Columns: run, worker, step, epoch, wall_s, loss, version_lag, clock_staleness, bytes_sent,
// bytes_received (on the wire), compute_ms, comm_ms, wait_ms, test_loss, test_accuracy, test_auc (a model that scores
// examples by a probability: the area under its ROC curve; empty otherwise), delay_ms (an injected straggler
// delay, not counted in compute_ms or comm_ms), hidden_ms (the part of comm_ms that ran behind
// computation, with --overlap: comm_ms - hidden_ms is what the step waited for; all-reduce: the
// communication thread's busy time before backward ended; PS: computation between two layer
// boundaries at both of which a pull was unanswered or pushed bytes were still queued, a lower
// bound), loss_scale, skipped_steps, shm_bytes_sent, shm_bytes_received (values moved through
// shared memory with processes of this host, counted as the wire would count them; not in
// bytes_sent / bytes_received), table_rows (a model with embedding tables: the rows the step read
// and whose gradients it sent, its batch's unique ids over every table; 0 without), rows_pulled,
// cache_hits, read_staleness, cache_saved_bytes (PS modes with tables: MetricsRow::RowReads). A
// training row leaves test_* empty;
// an evaluation row (written by the evaluating worker after an evaluation) fills them and
// carries the mean training loss since the previous evaluation in `loss`. A NaN field is
// written empty. Not thread-safe: one writer per file.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

struct MetricsRow {
  // PS modes: how stale the step's exchange with the shards was, as the PS client measures it.
  struct Staleness {
    // Of this worker's last push: shard updates between the version its gradient was computed
    // on and the one it was applied to (max over the shards).
    double version_lag = NAN;
    // Of this worker's last answered pull: its clock minus the lowest clock whose updates the
    // answer is guaranteed to hold (max over the shards; ssp bounds it by s).
    double clock_staleness = NAN;
  };
  // Bytes moved so far (cumulative), as the transports count them.
  struct Traffic {
    uint64_t bytes_sent = 0;  // on the wire
    uint64_t bytes_received = 0;
    uint64_t shm_bytes_sent = 0;  // through shared memory
    uint64_t shm_bytes_received = 0;
  };
  // Where the step's time went, as the training loop times it.
  struct Times {
    double compute_ms = 0.0;  // forward + backward + local update of the step
    double comm_ms = 0.0;     // pushing, pulling or all-reducing
    double wait_ms = 0.0;     // blocked on consistency (barrier, staleness bound)
    double delay_ms = 0.0;    // straggler delay injected in this step
    double hidden_ms = 0.0;   // communication that ran behind the backward pass (overlap)
  };
  // An evaluation row's: the evaluation of the test set.
  struct Test {
    double loss = NAN;
    double accuracy = NAN;  // fraction in [0, 1]
    double auc = NAN;       // area under the ROC curve (dlrm, sparse_logreg); NaN for a classifier of classes
  };

  int64_t step = 0;         // steps (iterations) this worker has finished
  double epoch = 0.0;       // fractional epochs done
  double wall_s = 0.0;      // seconds since the run started
  double loss = NAN;        // mean training loss of the step (or of the epoch, on eval rows)
  Staleness staleness;
  Traffic traffic;
  Times times;
  Test test;
  // --precision=fp16: the loss scale the step's gradient was computed with, and the steps
  // skipped so far because their gradients overflowed (cumulative). NaN / 0 otherwise.
  double loss_scale = NAN;
  int64_t skipped_steps = 0;
  // A model with embedding tables: rows the step pulled (or read) and pushed (or applied), the
  // batch's unique ids over every table; 0 without tables.
  int64_t table_rows = 0;
  // PS modes with tables: how the step's reads of rows were served (its batch's, and any a
  // frontend's forward or an evaluation made at its clock): pulled from the shards, or served
  // from the worker's row cache (ssp), the bytes of rows the cache saved pulling, and the oldest
  // row read: the reading clock minus the lowest clock whose updates the row was guaranteed to
  // hold, as the worker counts it (at most ssp's bound s; -1, written empty: no row read).
  struct RowReads {
    int64_t pulled = 0;
    int64_t cached = 0;
    uint64_t saved_bytes = 0;
    int64_t max_staleness = -1;

    void Add(const RowReads& o) {
      pulled += o.pulled;
      cached += o.cached;
      saved_bytes += o.saved_bytes;
      if (o.max_staleness > max_staleness) max_staleness = o.max_staleness;
    }
  };
  RowReads row_reads;
};

// The q-quantile (0..1) of a histogram (value -> count): the smallest value whose cumulative
// count reaches q of the total; 0 for an empty histogram.
int64_t HistogramQuantile(const std::map<int64_t, int64_t>& hist, double q);

// The median of `v` (the mean of the middle two for an even count); 0 for none.
double Median(std::vector<double> v);

// Column indexes of MetricsWriter::kHeader, for readers of the file.
enum MetricsColumn {
  kColRun, kColWorker, kColStep, kColEpoch, kColWall, kColLoss, kColVersionLag, kColClockStaleness, kColBytesSent,
  kColBytesReceived,
  kColCompute, kColComm, kColWait, kColTestLoss, kColTestAccuracy, kColTestAuc, kColDelay, kColHidden, kColLossScale,
  kColSkippedSteps, kColShmBytesSent, kColShmBytesReceived, kColTableRows, kColRowsPulled, kColCacheHits,
  kColReadStaleness, kColCacheSavedBytes, kMetricsColumns
};

// The fields of one CSV line (no quoting: the metrics files have none); "a,,b," has 4 fields.
std::vector<std::string> SplitCsv(const std::string& line);

class MetricsWriter {
 public:
  static constexpr const char* kHeader =
      "run,worker,step,epoch,wall_s,loss,version_lag,clock_staleness,bytes_sent,bytes_received,compute_ms,comm_ms,"
      "wait_ms,test_loss,test_accuracy,test_auc,delay_ms,hidden_ms,loss_scale,skipped_steps,shm_bytes_sent,shm_bytes_received,"
      "table_rows,rows_pulled,cache_hits,read_staleness,cache_saved_bytes";

  // Creates (truncates) `path`, creating parent directories, and writes the header.
  static Result<MetricsWriter> Open(const std::string& path, std::string run, int worker);

  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&&) = delete;
  ~MetricsWriter();

  Status Write(const MetricsRow& row);
  Status Flush();

 private:
  MetricsWriter(std::FILE* f, std::string path, std::string run, int worker)
      : file_(f), path_(std::move(path)), run_(std::move(run)), worker_(worker) {}
  std::FILE* file_;
  std::string path_;
  std::string run_;
  int worker_;
};

}  // namespace gradsync
