// gradsync-bench-ps --processes: the scheduler and every shard as real gradsync-server
// processes, every worker as a process of its own (this binary re-executed with a hidden
// --role=...), and the ceilings measured in the same run, also across processes: raw ZeroMQ
// PUSH/PULL and REQ/REP with the shards' message sizes, one TCP stream, memcpy. Small requests
// (--small-keys: sparse pushes and pulls of a few keys) in round trips/s, beside raw ZeroMQ
// REQ/REP round trips of the same bytes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gradsync.pb.h"

namespace gradsync::psbench {

// The job both modes initialize: one dense tensor "w" of `size` floats, constant rate 1.
inline wire::JobConfig BenchJobConfig(int64_t size, int workers) {
  wire::JobConfig config;
  auto* t = config.add_tensors();
  t->set_name("w");
  t->set_size(static_cast<uint64_t>(size));
  config.set_num_params(static_cast<uint64_t>(size));
  config.set_num_workers(workers);
  config.set_lr(1.0f);
  config.set_lr_schedule("constant");
  return config;
}

// The statistics both modes report: the median, and the q-quantile (nearest rank).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// argv[1] starts with "--role=": this process is one of the parent's children. Returns the
// exit status.
bool IsRole(int argc, char** argv);
int RunRole(int argc, char** argv);

// The whole --processes run; prints the tables. iters_flag 0: the in-process defaults. sizes may
// be empty (small requests only). paths: "tcp" (values over ZeroMQ) and/or "shm" (through
// shared-memory lanes), each configuration once per path. small_keys > 0: per configuration, also
// small requests (a sparse push and a sparse pull of small_keys keys, small_iters operations per
// repeat) in round trips/s beside a REQ/REP ceiling of the same bytes. Returns the exit status (1
// when a value came back wrong or a child failed).
int RunProcesses(const std::vector<int64_t>& sizes, const std::vector<std::pair<int, int>>& configs,
                 const std::vector<std::string>& paths, int iters_flag, int repeats, int small_keys, int small_iters,
                 const std::string& json_path);

}  // namespace gradsync::psbench
