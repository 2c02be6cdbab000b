// gradsync-bench-ps --processes --rows=BATCHxFEATURES: sparse push+pull of embedding-table rows,
// the DLRM-style step's exchange with the shards, as real processes (the scheduler and the shards
// gradsync-server processes, each worker this binary re-executed with --role=rows-worker).
//
// Per dim and SERVERSxWORKERS configuration, a job whose model is FEATURES tables of --row-ids
// ids x dim floats (zeros, SGD at rate 1, asp) beside a dense tensor of 64 floats. Each worker
// draws --row-sets batches before anything is timed: per table BATCH ids, Zipf(--row-zipf) ranks
// over the ids scattered by a seeded bijection (common/data/click/zipf.h, the click log's
// draws), sorted and unique per table. One operation is a step's exchange: a push of the
// batch's row gradients (all 1, with the dense tensor's zeros), waited, then a pull of its rows,
// waited (PsClient::Push / Pull with the batch's TablePlan, as PsSync sends them). Rows/s = every
// worker's rows of its operations in a repeat (each row counted once per push+pull) / the
// repeat's wall time (first start to last end over the workers, started together by a scheduler
// barrier); the median over repeats, latency p50/p99 over every operation. After the loops each
// worker checks the rows it pulled last: each moved by at least its own push (-1/W), else wrong.
//
// --row-keys-out=PREFIX writes each worker's batches as ps-lite would address them, so that
// bench/pslite/ runs the same rows: PREFIX-<rank>.bin, little-endian u64 words: the magic
// "GSROWKEY", the number of batches, then per batch its number of keys and the keys, each
// SplitMix64(table << 40 | id) (a bijection, so every row has one key, spread evenly over
// ps-lite's range partition), sorted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::psbench {

struct RowsOptions {
  int batch = 4096;
  int features = 26;
  std::vector<int> dims = {16, 64};
  uint64_t ids = 100000000;
  double zipf = 1.05;
  int sets = 8;  // batches each worker cycles through
  int iters = 10;
  int repeats = 5;
  std::vector<std::pair<int, int>> configs = {{2, 2}};
  std::vector<std::string> paths = {"zmq"};  // zmq: loopback TCP; shm: the shards' lanes attached (co-located)
  std::string keys_out;                      // PREFIX, or none
  std::string json;                          // also write the rows here
};

// The parent: every dim, configuration and path as a job; prints the table. Returns the exit
// status (1 when a child failed or a value came back wrong).
int RunRowsProcs(const RowsOptions& o);
// --role=rows-worker.
int RunRowsWorker(const std::map<std::string, std::string>& a);

}  // namespace gradsync::psbench
