// The ps-lite side of the gradsync-bench-ps --processes comparison (see README.md here). One
// binary for every ps-lite role; DMLC_ROLE picks it (scheduler, server, worker), run.sh sets it.
//
//   pslite_driver --floats=N --iters=I --repeats=R
//   pslite_driver --rows-keys=PREFIX --dim=D --iters=I --repeats=R
//
// Rows (--rows-keys, as gradsync-bench-ps --processes --rows): worker r reads the batches of keys
// gradsync's worker r drew (PREFIX-<r>.bin, written by --row-keys-out: per batch its sorted keys,
// one per embedding row), and each operation is a step's exchange of one batch: a ZPush of its
// rows' gradients (D floats of 1 per key), waited, then a ZPull of its rows, waited, cycling
// through the batches (each once as warm-up). A server keeps a row of D floats per key pushed,
// adds each pushed row into it and answers a pull with the rows (zeros for a key never pushed,
// not stored, as gradsync's shards answer a row they do not hold). It prints per repeat
// "R repeat start_ns end_ns rows" (the keys of its operations), "L latency_ms...", and "W wrong":
// the rows of its last pull that did not move by at least its own push (each must be >= 1, the
// pushes of 1 summing).
//
// Written against ps-lite's public API only (ps/ps.h). The tensor of N floats is split evenly
// over the S servers: one key per server (the first key of its range in GetServerKeyRanges()),
// its value a block of N/S floats (the first N%S blocks one float longer), so that every server
// receives exactly one dense message per push and sends one per pull. A server keeps one block
// per key, adds every pushed block into it and answers a pull with a copy of it.
//
// Each worker runs the loops of gradsync-bench-ps --processes: for op in push, pull, push+pull
// (a push waited, then a pull waited): 2 warm-up operations, then R repeats of I operations,
// every repeat started by all workers together (Postoffice::Barrier on the worker group). It
// prints on stdout, per repeat, "R op repeat start_ns end_ns" (steady_clock, one clock for every
// process of the machine), per op "L op latency_ms...", and at the end "W wrong": after a last
// worker barrier each worker pulls once and counts the values that differ from what all pushes
// must have summed to (every push sends 1.0 in every position).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// --name=VALUE, or "" when absent.
std::string StrFlag(int argc, char** argv, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return "";
}

int64_t Flag(int argc, char** argv, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  std::fprintf(stderr, "pslite_driver: --%s=... missing\n", name);
  std::exit(2);
}

// Summing store: one dense block per key.
struct SumHandle {
  std::unordered_map<ps::Key, std::vector<float>> store;

  void operator()(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVServer<float>* server) {
    const size_t n = req.keys.size();
    ps::KVPairs<float> res;
    if (meta.push) {
      size_t off = 0;
      for (size_t i = 0; i < n; ++i) {
        const size_t len = req.lens.empty() ? req.vals.size() / n : static_cast<size_t>(req.lens[i]);
        std::vector<float>& block = store[req.keys[i]];
        if (block.empty()) block.assign(len, 0.0f);
        CHECK_EQ(block.size(), len) << "pushed block length changed";
        const float* __restrict src = req.vals.data() + off;
        float* __restrict dst = block.data();
        for (size_t j = 0; j < len; ++j) dst[j] += src[j];
        off += len;
      }
    }
    if (meta.pull) {
      size_t total = 0;
      for (size_t i = 0; i < n; ++i) {
        auto it = store.find(req.keys[i]);
        CHECK(it != store.end()) << "pull of a key never pushed";
        total += it->second.size();
      }
      res.keys = req.keys;
      res.vals.resize(total);
      res.lens.resize(n);
      size_t off = 0;
      for (size_t i = 0; i < n; ++i) {
        const std::vector<float>& block = store[req.keys[i]];
        std::memcpy(res.vals.data() + off, block.data(), block.size() * sizeof(float));
        res.lens[i] = static_cast<int>(block.size());
        off += block.size();
      }
    }
    server->Response(meta, res);
  }
};

// Rows: one row of `dim` floats per key pushed; a pull of a key never pushed answers zeros.
struct RowsHandle {
  int dim = 0;
  std::unordered_map<ps::Key, std::vector<float>> rows;

  void operator()(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVServer<float>* server) {
    const size_t n = req.keys.size(), d = static_cast<size_t>(dim);
    ps::KVPairs<float> res;
    if (meta.push) {
      CHECK_EQ(req.vals.size(), n * d) << "a push of rows of another dim";
      for (size_t i = 0; i < n; ++i) {
        std::vector<float>& row = rows[req.keys[i]];
        if (row.empty()) row.assign(d, 0.0f);
        const float* __restrict src = req.vals.data() + i * d;
        float* __restrict dst = row.data();
        for (size_t j = 0; j < d; ++j) dst[j] += src[j];
      }
    }
    if (meta.pull) {
      res.keys = req.keys;
      res.vals.resize(n * d);
      for (size_t i = 0; i < n; ++i) {
        auto it = rows.find(req.keys[i]);
        float* dst = res.vals.data() + i * d;
        if (it == rows.end()) {
          std::memset(dst, 0, d * sizeof(float));
        } else {
          std::memcpy(dst, it->second.data(), d * sizeof(float));
        }
      }
    }
    server->Response(meta, res);
  }
};

// PREFIX-<rank>.bin: the magic "GSROWKEY", the number of batches, per batch its count and keys.
std::vector<ps::SArray<ps::Key>> ReadBatches(const std::string& path) {
  std::ifstream f(path.c_str(), std::ios::binary);
  std::vector<uint64_t> words;
  uint64_t w = 0;
  while (f.read(reinterpret_cast<char*>(&w), sizeof(w))) words.push_back(w);
  CHECK_GE(words.size(), 2u) << path << ": no batches (gradsync-bench-ps --row-keys-out writes them)";
  CHECK_EQ(std::memcmp(&words[0], "GSROWKEY", 8), 0) << path << ": not a file of row keys";
  std::vector<ps::SArray<ps::Key>> batches;
  size_t at = 2;
  for (uint64_t b = 0; b < words[1]; ++b) {
    CHECK_LT(at, words.size()) << path << ": cut short";
    const size_t n = static_cast<size_t>(words[at++]);
    CHECK_LE(at + n, words.size()) << path << ": cut short";
    ps::SArray<ps::Key> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = words[at + i];
    at += n;
    batches.push_back(keys);
  }
  return batches;
}

void RunRowsWorker(const std::string& prefix, int dim, int iters, int repeats) {
  ps::KVWorker<float> kv(0, 0);
  std::ostringstream name;
  name << prefix << "-" << ps::MyRank() << ".bin";
  const std::vector<ps::SArray<ps::Key>> batches = ReadBatches(name.str());
  std::vector<ps::SArray<float>> grads, rows;
  for (size_t b = 0; b < batches.size(); ++b) {
    grads.push_back(ps::SArray<float>(batches[b].size() * static_cast<size_t>(dim), 1.0f));
    rows.push_back(ps::SArray<float>(batches[b].size() * static_cast<size_t>(dim), 0.0f));
  }
  auto one = [&](size_t b) {
    const auto t0 = Clock::now();
    kv.Wait(kv.ZPush(batches[b], grads[b]));
    kv.Wait(kv.ZPull(batches[b], &rows[b]));
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (size_t b = 0; b < batches.size(); ++b) one(b);  // warm-up: every batch
  std::ostringstream out;
  std::vector<double> lat;
  size_t next = 0;
  for (int r = 0; r < repeats; ++r) {
    ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
    int64_t moved = 0;
    const int64_t t0 = NowNs();
    for (int i = 0; i < iters; ++i, ++next) {
      lat.push_back(one(next % batches.size()));
      moved += static_cast<int64_t>(batches[next % batches.size()].size());
    }
    out << "R " << r << " " << t0 << " " << NowNs() << " " << moved << "\n";
  }
  out << "L";
  for (size_t i = 0; i < lat.size(); ++i) out << " " << lat[i];
  out << "\n";
  const ps::SArray<float>& last = rows[(next + batches.size() - 1) % batches.size()];
  int64_t wrong = 0;
  for (size_t i = 0; i < last.size(); ++i) wrong += !(last[i] >= 0.5f);
  out << "W " << wrong << "\n";
  std::fputs(out.str().c_str(), stdout);
  std::fflush(stdout);
}

void RunWorker(int64_t floats, int iters, int repeats) {
  ps::KVWorker<float> kv(0, 0);
  const int servers = ps::NumServers(), workers = ps::NumWorkers();
  const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  ps::SArray<ps::Key> keys(static_cast<size_t>(servers));
  ps::SArray<int> lens(static_cast<size_t>(servers));
  for (int s = 0; s < servers; ++s) {
    keys[s] = ranges[s].begin();
    lens[s] = static_cast<int>(floats / servers + (s < floats % servers ? 1 : 0));
  }
  ps::SArray<float> grads(static_cast<size_t>(floats), 1.0f), params(static_cast<size_t>(floats), 0.0f);
  int64_t pushes = 0;
  std::ostringstream out;
  for (int k = 0; k < 3; ++k) {  // 0 push, 1 pull, 2 push+pull
    auto one = [&] {
      const auto t0 = Clock::now();
      if (k != 1) {
        kv.Wait(kv.ZPush(keys, grads, lens));
        ++pushes;
      }
      if (k != 0) kv.Wait(kv.ZPull(keys, &params));
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    for (int i = 0; i < 2; ++i) one();  // warm-up
    std::vector<double> lat;
    for (int r = 0; r < repeats; ++r) {
      ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
      const int64_t t0 = NowNs();
      for (int i = 0; i < iters; ++i) lat.push_back(one());
      out << "R " << k << " " << r << " " << t0 << " " << NowNs() << "\n";
    }
    out << "L " << k;
    for (double l : lat) out << " " << l;
    out << "\n";
  }
  // Every worker's pushes are done: each value is the number of pushes of all workers.
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  kv.Wait(kv.ZPull(keys, &params));
  const float want = static_cast<float>(pushes * workers);
  int64_t wrong = 0;
  for (size_t i = 0; i < params.size(); ++i) wrong += params[i] != want;
  out << "W " << wrong << "\n";
  std::fputs(out.str().c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string rows_keys = StrFlag(argc, argv, "rows-keys");
  const int iters = static_cast<int>(Flag(argc, argv, "iters")), repeats = static_cast<int>(Flag(argc, argv, "repeats"));
  ps::Start(0);
  if (ps::IsServer()) {
    auto* server = new ps::KVServer<float>(0);
    if (rows_keys.empty()) {
      server->set_request_handle(SumHandle());
    } else {
      RowsHandle rows;
      rows.dim = static_cast<int>(Flag(argc, argv, "dim"));
      server->set_request_handle(rows);
    }
    ps::RegisterExitCallback([server] { delete server; });  // runs inside Finalize
  }
  if (ps::IsWorker()) {
    if (rows_keys.empty()) {
      RunWorker(Flag(argc, argv, "floats"), iters, repeats);
    } else {
      RunRowsWorker(rows_keys, static_cast<int>(Flag(argc, argv, "dim")), iters, repeats);
    }
  }
  ps::Finalize(0, true);
  return 0;
}
