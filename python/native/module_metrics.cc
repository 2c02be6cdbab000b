#include "python/native/module_metrics.h"

#include <pybind11/stl.h>

#include <cmath>
#include <map>
#include <string>

#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "python/native/frontend.h"

namespace py = pybind11;

namespace gradsync::python {
namespace {

double Get(const py::dict& d, const char* key, double fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return d[key].cast<double>();
}

// A step's reads of table rows under the metrics columns' names, and back (a missing one: none).
void PutRowReads(const MetricsRow::RowReads& r, py::dict& d) {
  d["rows_pulled"] = r.pulled;
  d["cache_hits"] = r.cached;
  d["cache_saved_bytes"] = r.saved_bytes;
  d["read_staleness"] = r.max_staleness;
}

MetricsRow::RowReads RowReadsFrom(const py::dict& d) {
  return {.pulled = static_cast<int64_t>(Get(d, "rows_pulled", 0)),
          .cached = static_cast<int64_t>(Get(d, "cache_hits", 0)),
          .saved_bytes = static_cast<uint64_t>(Get(d, "cache_saved_bytes", 0)),
          .max_staleness = static_cast<int64_t>(Get(d, "read_staleness", -1))};
}

MetricsRow RowFrom(const py::dict& d) {
  MetricsRow r;
  r.step = static_cast<int64_t>(Get(d, "step", 0));
  r.epoch = Get(d, "epoch", 0);
  r.wall_s = Get(d, "wall_s", 0);
  r.loss = Get(d, "loss", NAN);
  r.staleness.version_lag = Get(d, "version_lag", NAN);
  r.staleness.clock_staleness = Get(d, "clock_staleness", NAN);
  r.traffic.bytes_sent = static_cast<uint64_t>(Get(d, "bytes_sent", 0));
  r.traffic.bytes_received = static_cast<uint64_t>(Get(d, "bytes_received", 0));
  r.traffic.shm_bytes_sent = static_cast<uint64_t>(Get(d, "shm_bytes_sent", 0));
  r.traffic.shm_bytes_received = static_cast<uint64_t>(Get(d, "shm_bytes_received", 0));
  r.times.compute_ms = Get(d, "compute_ms", 0);
  r.times.comm_ms = Get(d, "comm_ms", 0);
  r.times.wait_ms = Get(d, "wait_ms", 0);
  r.test.loss = Get(d, "test_loss", NAN);
  r.test.accuracy = Get(d, "test_accuracy", NAN);
  r.test.auc = Get(d, "test_auc", NAN);
  r.times.delay_ms = Get(d, "delay_ms", 0);
  r.times.hidden_ms = Get(d, "hidden_ms", 0);
  r.loss_scale = Get(d, "loss_scale", NAN);
  r.skipped_steps = static_cast<int64_t>(Get(d, "skipped_steps", 0));
  r.table_rows = static_cast<int64_t>(Get(d, "table_rows", 0));
  r.row_reads = RowReadsFrom(d);
  return r;
}

}  // namespace

py::dict StatsDict(const SyncStepStats& s) {
  py::dict d;
  d["comm_ms"] = s.comm_ms;
  d["wait_ms"] = s.wait_ms;
  d["hidden_ms"] = s.hidden_ms;
  d["blocked_ms"] = s.blocked_ms;
  d["version_lag"] = s.version_lag;
  d["clock_staleness"] = s.clock_staleness;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["shm_bytes_sent"] = s.shm_bytes_sent;
  d["shm_bytes_received"] = s.shm_bytes_received;
  d["loss_scale"] = s.loss_scale;
  d["skipped_steps"] = s.skipped_steps;
  d["table_rows"] = s.table_rows;
  PutRowReads(s.row_reads, d);
  return d;
}

void BindMetrics(py::module_& m) {
  py::class_<MetricsWriter>(m, "MetricsWriter")
      .def(py::init([](const std::string& path, const std::string& run, int worker) {
             auto w = MetricsWriter::Open(path, run, worker);
             ThrowIfError(w.status());
             return std::make_unique<MetricsWriter>(std::move(w).value());
           }),
           py::arg("path"), py::arg("run"), py::arg("worker"))
      .def("write", [](MetricsWriter& w, const py::dict& row) { ThrowIfError(w.Write(RowFrom(row))); })
      .def("flush", [](MetricsWriter& w) { ThrowIfError(w.Flush()); });
  m.attr("METRICS_HEADER") = MetricsWriter::kHeader;

  m.def(
      "write_worker_summary",
      [](const std::string& dir, const py::dict& d) {
        summary::ProcessSummary s;
        s.set_role("worker");
        s.set_rank(static_cast<int>(Get(d, "rank", 0)));
        s.set_mode(d.contains("mode") ? d["mode"].cast<std::string>() : "local");
        if (d.contains("staleness_bound")) s.set_staleness_bound(d["staleness_bound"].cast<int>());
        const std::string err = d.contains("error") ? d["error"].cast<std::string>() : "";
        s.set_ok(err.empty());
        if (!err.empty()) s.set_error(err);
        s.set_params(static_cast<int64_t>(Get(d, "params", 0)));
        s.set_steps(static_cast<int64_t>(Get(d, "steps", 0)));
        s.set_wall_s(Get(d, "wall_s", 0));
        if (const double acc = Get(d, "final_test_accuracy", NAN); !std::isnan(acc)) s.set_final_test_accuracy(acc);
        s.set_bytes_sent(static_cast<int64_t>(Get(d, "bytes_sent", 0)));
        s.set_bytes_received(static_cast<int64_t>(Get(d, "bytes_received", 0)));
        s.set_shm_bytes_sent(static_cast<int64_t>(Get(d, "shm_bytes_sent", 0)));
        s.set_shm_bytes_received(static_cast<int64_t>(Get(d, "shm_bytes_received", 0)));
        if (d.contains("params_sha256")) s.set_params_sha256(d["params_sha256"].cast<std::string>());
        if (d.contains("row_reads")) SetRowReads(RowReadsFrom(d["row_reads"].cast<py::dict>()), &s);
        if (d.contains("replies")) {
          const py::dict r = d["replies"].cast<py::dict>();
          PsClient::ReplyCounts c;
          c.pushes = r["pushes"].cast<int64_t>();
          c.pulls = r["pulls"].cast<int64_t>();
          c.version_lag = r["version_lag"].cast<std::map<int64_t, int64_t>>();
          c.clock_staleness = r["clock_staleness"].cast<std::map<int64_t, int64_t>>();
          SetReplyCounts(c, &s);
        }
        ThrowIfError(WriteProcessSummary(dir, s));
      },
      py::arg("dir"), py::arg("summary"));
}

}  // namespace gradsync::python
