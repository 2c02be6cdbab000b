// gradsync-bench-ps --processes --rows (see ps_bench_rows.h).
#include "bench/ps_bench_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "bench/ps_bench_jobs.h"
#include "bench/ps_bench_procs.h"
#include "common/base/numeric/rng.h"
#include "common/data/click/zipf.h"
#include "common/ps/table_wire.h"
#include "common/table/table_spec.h"
#include "worker/ps/table_plan.h"

namespace gradsync::psbench {
namespace {

constexpr int64_t kDense = 64;        // the job's dense tensor: a step's push carries it, as PsSync's
constexpr uint64_t kKeySeed = 0x726f7773;  // the batches' draws ("rows")

std::vector<TableSpec> RowTables(int features, int dim, uint64_t ids) {
  std::vector<TableSpec> tables(static_cast<size_t>(features));
  for (int t = 0; t < features; ++t) {
    TableSpec& s = tables[static_cast<size_t>(t)];
    s.name = "f" + std::to_string(t);
    s.dim = dim;
    s.num_ids = ids;
    s.init = {RowInit::Kind::kZeros, 1.0f};
    s.init_seed = static_cast<uint64_t>(t);
  }
  return tables;
}

// Worker w's batch i: per table, the sorted unique ids of `batch` Zipf draws.
std::vector<std::vector<uint64_t>> DrawBatch(int w, int i, int features, int batch, const ZipfSampler& zipf,
                                             const std::vector<IdPermutation>& scatter) {
  std::vector<std::vector<uint64_t>> ids(static_cast<size_t>(features));
  for (int t = 0; t < features; ++t) {
    SplitMixStream stream(Rng::Derive(kKeySeed, static_cast<uint64_t>(w), static_cast<uint64_t>(i),
                                      static_cast<uint64_t>(t)));
    auto& v = ids[static_cast<size_t>(t)];
    v.reserve(static_cast<size_t>(batch));
    for (int j = 0; j < batch; ++j) v.push_back(scatter[static_cast<size_t>(t)].Forward(zipf.Sample(&stream) - 1));
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return ids;
}

// PREFIX-<rank>.bin (ps_bench_rows.h).
void WriteKeys(const std::string& path, const std::vector<std::vector<std::vector<uint64_t>>>& batches) {
  std::vector<uint64_t> words;
  uint64_t magic = 0;
  std::memcpy(&magic, "GSROWKEY", 8);
  words.push_back(magic);
  words.push_back(batches.size());
  for (const auto& batch : batches) {
    std::vector<uint64_t> keys;
    for (size_t t = 0; t < batch.size(); ++t) {
      for (uint64_t id : batch[t]) keys.push_back(Rng::SplitMix64(uint64_t{t} << 40 | id));
    }
    std::sort(keys.begin(), keys.end());
    words.push_back(keys.size());
    words.insert(words.end(), keys.begin(), keys.end());
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(words.data()), static_cast<std::streamsize>(words.size() * sizeof(uint64_t)));
  if (!f) Die("cannot write " + path);
}

}  // namespace

int RunRowsWorker(const std::map<std::string, std::string>& a) {
  const int w = static_cast<int>(Int(a, "rank")), workers = static_cast<int>(Int(a, "workers"));
  const int servers = static_cast<int>(Int(a, "servers"));
  const int features = static_cast<int>(Int(a, "features")), batch = static_cast<int>(Int(a, "batch"));
  const int dim = static_cast<int>(Int(a, "dim")), sets = static_cast<int>(Int(a, "sets"));
  const int iters = static_cast<int>(Int(a, "iters")), repeats = static_cast<int>(Int(a, "repeats"));
  const auto ids = static_cast<uint64_t>(Int(a, "ids"));
  const double zipf_s = std::stod(Str(a, "zipf"));
  const std::vector<TableSpec> tables = RowTables(features, dim, ids);

  // The batches, drawn and planned before anything is timed (as the ps-lite driver's keys).
  const ZipfSampler zipf(ids, zipf_s);
  std::vector<IdPermutation> scatter;
  for (int t = 0; t < features; ++t) scatter.emplace_back(ids, Rng::Derive(kKeySeed, 1000, static_cast<uint64_t>(t)));
  std::vector<std::vector<std::vector<uint64_t>>> batches;
  std::vector<TablePlan> plans;
  std::vector<std::vector<float>> grads, rows;
  std::vector<int64_t> batch_rows;
  for (int i = 0; i < sets; ++i) {
    batches.push_back(DrawBatch(w, i, features, batch, zipf, scatter));
    plans.emplace_back(tables, servers);
    if (Status s = plans.back().Set(batches.back()); !s.ok()) Die("batch: " + s.message());
    grads.emplace_back(plans.back().floats(), 1.0f);
    rows.emplace_back(plans.back().floats(), 0.0f);
    int64_t n = 0;
    for (const auto& v : batches.back()) n += static_cast<int64_t>(v.size());
    batch_rows.push_back(n);
  }
  if (a.count("keys-out")) WriteKeys(a.at("keys-out") + "-" + std::to_string(w) + ".bin", batches);

  wire::JobConfig config = BenchJobConfig(kDense, workers);
  SetJobTables(tables, &config);
  // A message of rows to one shard at most: every id of a batch, with its key.
  const int64_t row_bytes = int64_t{batch} * features * (int64_t{dim} * 4 + 8);
  auto job = JoinBenchJob(a, {{"w", {kDense}, 0, kDense, false}}, config, row_bytes);
  SchedulerClient& client = *job->client;
  PsClient* ps = job->ps.get();
  if (Str(a, "path") == "shm") {
    AttachEveryLane(*ps, servers);
  }
  const std::vector<float> dense(kDense, 0.0f);
  int64_t clock = 0;
  auto one = [&](size_t i) {
    const auto t0 = Clock::now();
    auto push = ps->Push(clock, dense, {}, {}, NAN, {}, {}, StepRows{&plans[i], grads[i]});
    if (!push.ok()) Die("push: " + push.status().message());
    if (Status s = ps->Wait(*push, 60); !s.ok()) Die("push: " + s.message());
    ++clock;
    auto pull = ps->Pull(clock, {}, {}, false, StepRows{&plans[i], rows[i]});
    if (!pull.ok()) Die("pull: " + pull.status().message());
    if (Status s = ps->Wait(*pull, 60); !s.ok()) Die("pull: " + s.message());
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (size_t i = 0; i < static_cast<size_t>(sets); ++i) one(i);  // warm-up: every batch
  std::ostringstream out;
  std::vector<double> lat;
  size_t next = 0;
  for (int r = 0; r < repeats; ++r) {
    if (Status s = client.Barrier("rows_" + std::to_string(r), "workers", 60); !s.ok()) Die("worker barrier: " + s.message());
    int64_t moved = 0;
    const int64_t t0 = NowNs();
    for (int k = 0; k < iters; ++k, ++next) {
      lat.push_back(one(next % static_cast<size_t>(sets)));
      moved += batch_rows[next % static_cast<size_t>(sets)];
    }
    out << "R " << r << " " << t0 << " " << NowNs() << " " << moved << "\n";
  }
  out << "L";
  for (double l : lat) out << " " << l;
  out << "\n";
  // The last batch's rows as pulled after this worker's push of them was applied: each at most
  // -1/W (SGD at rate 1 on the gradient 1 / W, every other push moving it further down).
  const size_t last = (next + static_cast<size_t>(sets) - 1) % static_cast<size_t>(sets);
  int64_t wrong = 0;
  for (float v : rows[last]) wrong += !(v <= -0.5f / static_cast<float>(workers));
  out << "W " << wrong << "\n";
  return Leave(client, out.str());
}

namespace {

struct RowsRow {
  std::string path;
  int dim = 0, servers = 0, workers = 0;
  double rows_per_op = 0;  // mean over the workers' operations
  double rows_per_s = 0, p50_ms = 0, p99_ms = 0;
  int64_t wrong = 0;
};

bool RunRowsConfig(const RowsOptions& o, const std::string& path, int dim, int servers, int workers, RowsRow* row) {
  std::vector<std::string> args = {"--kind=rows", "--servers=" + std::to_string(servers),
                                   "--features=" + std::to_string(o.features), "--batch=" + std::to_string(o.batch),
                                   "--dim=" + std::to_string(dim), "--sets=" + std::to_string(o.sets),
                                   "--iters=" + std::to_string(o.iters), "--repeats=" + std::to_string(o.repeats),
                                   "--ids=" + std::to_string(o.ids), "--zipf=" + std::to_string(o.zipf), "--path=" + path};
  if (!o.keys_out.empty()) args.push_back("--keys-out=" + o.keys_out);
  std::vector<std::string> texts;
  const std::string what = "rows of dim " + std::to_string(dim) + " (" + path + ")";
  if (!RunJobProcs(servers, workers, args, what, &texts)) return false;
  const auto repeats = static_cast<size_t>(o.repeats);
  std::vector<int64_t> t0(repeats, INT64_MAX), t1(repeats, 0), moved(repeats, 0);
  std::vector<double> lat;
  int lines = 0;
  *row = {path, dim, servers, workers};
  for (const std::string& text : texts) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::string tag;
      ls >> tag;
      if (tag == "R") {
        size_t r = 0;
        int64_t a = 0, b = 0, n = 0;
        ls >> r >> a >> b >> n;
        if (r >= repeats) continue;
        t0[r] = std::min(t0[r], a);
        t1[r] = std::max(t1[r], b);
        moved[r] += n;
        ++lines;
      } else if (tag == "L") {
        for (double v; ls >> v;) lat.push_back(v);
      } else if (tag == "W") {
        int64_t n = 0;
        ls >> n;
        row->wrong += n;
      }
    }
  }
  if (lines != o.repeats * workers) {
    std::fprintf(stderr, "gradsync-bench-ps: %s: the workers reported %d repeats, not %d\n", what.c_str(), lines,
                 o.repeats * workers);
    return false;
  }
  std::vector<double> rates;
  int64_t all = 0;
  for (size_t r = 0; r < repeats; ++r) {
    rates.push_back(static_cast<double>(moved[r]) / (static_cast<double>(t1[r] - t0[r]) / 1e9));
    all += moved[r];
  }
  row->rows_per_s = Median(rates);
  row->rows_per_op = static_cast<double>(all) / (static_cast<double>(o.iters) * o.repeats * workers);
  row->p50_ms = Quantile(lat, 0.5);
  row->p99_ms = Quantile(lat, 0.99);
  return true;
}

}  // namespace

int RunRowsProcs(const RowsOptions& o) {
  const std::string server_bin = SelfDir() + "/gradsync-server";
  if (::access(server_bin.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "gradsync-bench-ps: error: --processes needs %s (build it)\n", server_bin.c_str());
    return 1;
  }
  ::setenv("GRADSYNC_LOG_LEVEL", "warning", 1);
  std::printf("# gradsync-bench-ps --rows: sparse push+pull of embedding rows, %d tables x %llu ids, a batch of %d x %d "
              "Zipf(%g) ids per worker (%d batches cycled); rows/s over every worker (each row once per push+pull), "
              "median of %d repeats of %d ops; latency per op over all repeats\n",
              o.features, static_cast<unsigned long long>(o.ids), o.batch, o.features, o.zipf, o.sets, o.repeats, o.iters);
  std::printf("%-5s %4s %7s %7s %10s %12s %9s %9s %7s\n", "path", "dim", "servers", "workers", "rows/op", "rows/s",
              "p50_ms", "p99_ms", "#wrong");
  std::vector<RowsRow> all;
  bool failed = false;
  for (int dim : o.dims) {
    for (const auto& [servers, workers] : o.configs) {
      for (const std::string& path : o.paths) {
        RowsRow row;
        if (!RunRowsConfig(o, path, dim, servers, workers, &row)) {
          failed = true;
          continue;
        }
        std::printf("%-5s %4d %7d %7d %10.0f %12.0f %9.3f %9.3f %7lld\n", row.path.c_str(), row.dim, row.servers,
                    row.workers, row.rows_per_op, row.rows_per_s, row.p50_ms, row.p99_ms,
                    static_cast<long long>(row.wrong));
        std::fflush(stdout);
        all.push_back(row);
      }
    }
  }
  int64_t wrong = 0;
  for (const RowsRow& r : all) wrong += r.wrong;
  std::printf("# check: %s\n", wrong == 0 ? "every pulled row moved by this worker's push" : "WRONG ROWS");
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\"rows\": [";
    for (size_t i = 0; i < all.size(); ++i) {
      const RowsRow& r = all[i];
      f << (i ? ", " : "") << "{\"path\": \"" << r.path << "\", \"dim\": " << r.dim << ", \"servers\": " << r.servers
        << ", \"workers\": " << r.workers << ", \"rows_per_op\": " << r.rows_per_op << ", \"rows_per_s\": " << r.rows_per_s
        << ", \"p50_ms\": " << r.p50_ms << ", \"p99_ms\": " << r.p99_ms << ", \"wrong\": " << r.wrong << "}";
    }
    f << "]}\n";
  }
  return failed || wrong != 0 ? 1 : 0;
}

}  // namespace gradsync::psbench
