#include "python/native/module_tables.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "common/data/binary_metrics.h"
#include "common/data/click/click_log.h"
#include "common/table/table_spec.h"

namespace py = pybind11;

namespace gradsync::python {
namespace {

using Ids = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;

std::span<const uint64_t> IdSpan(const Ids& ids) {
  if (ids.ndim() != 1) throw StatusError(InvalidArgumentError("ids: a 1-D array"));
  return {ids.data(), static_cast<size_t>(ids.size())};
}

void BindTableSpec(py::module_& m) {
  py::class_<TableSpec>(m, "TableSpec")
      .def(py::init<>())
      .def_readwrite("name", &TableSpec::name)
      .def_readwrite("dim", &TableSpec::dim)
      .def_readwrite("num_ids", &TableSpec::num_ids, "0: any 64-bit id")
      .def_readwrite("init_seed", &TableSpec::init_seed)
      .def_readwrite("max_rows_per_shard", &TableSpec::max_rows_per_shard)
      .def_property(
          "init", [](const TableSpec& t) { return RowInitName(t.init); },
          [](TableSpec& t, const std::string& text) {
            Result<RowInit> init = ParseRowInit(text);
            ThrowIfError(init.status().WithContext("table '" + t.name + "' init"));
            t.init = *init;
          },
          "normal:STD | uniform:A | zeros")
      .def_property(
          "optimizer", [](const TableSpec& t) { return std::string(RowOptimizerKindName(t.optimizer.kind)); },
          [](TableSpec& t, const std::string& name) {
            Result<RowOptimizerKind> kind = ParseRowOptimizerKind(name);
            ThrowIfError(kind.status().WithContext("table '" + t.name + "' optimizer"));
            t.optimizer.kind = *kind;
          },
          "sgd | adagrad (row-wise) | adam (lazy)")
      .def_property(
          "eps", [](const TableSpec& t) { return t.optimizer.eps; },
          [](TableSpec& t, double v) { t.optimizer.eps = v; })
      .def_property(
          "initial_accumulator", [](const TableSpec& t) { return t.optimizer.initial_accumulator; },
          [](TableSpec& t, float v) { t.optimizer.initial_accumulator = v; })
      .def_property(
          "beta1", [](const TableSpec& t) { return t.optimizer.beta1; },
          [](TableSpec& t, double v) { t.optimizer.beta1 = v; })
      .def_property(
          "beta2", [](const TableSpec& t) { return t.optimizer.beta2; },
          [](TableSpec& t, double v) { t.optimizer.beta2 = v; });
}

}  // namespace

void BindTables(py::module_& m, py::class_<FrontendSync>& sync) {
  BindTableSpec(m);
  sync.def(
          "read_rows",
          [](FrontendSync& s, size_t table, const Ids& ids) {
            const std::span<const uint64_t> id_span = IdSpan(ids);
            if (table >= s.tables().specs().size()) ThrowIfError(s.tables().Read(table, {}, {}));
            const py::ssize_t dim = s.tables().specs()[table].dim;
            py::array_t<float> rows({static_cast<py::ssize_t>(id_span.size()), dim});
            std::span<float> out(rows.mutable_data(), static_cast<size_t>(rows.size()));
            {
              py::gil_scoped_release release;
              ThrowIfError(s.tables().Read(table, id_span, out));
            }
            return rows;
          },
          py::arg("table"), py::arg("ids"),
          "Table `table`'s rows of `ids` (uint64, sorted, unique) as float32 [len(ids), dim], as this step "
          "reads them (PS: pulled from the shards).")
      .def(
          "set_row_grads",
          [](FrontendSync& s, size_t table, const Ids& ids, const Floats& grads) {
            ThrowIfError(s.tables().SetGrads(table, IdSpan(ids), {grads.data(), static_cast<size_t>(grads.size())}));
          },
          py::arg("table"), py::arg("ids"), py::arg("grads"),
          "This step's gradients of table `table`'s rows `ids` (summed per id), sent or applied by finish_step().")
      .def_property_readonly("table_step_rows", [](FrontendSync& s) { return s.tables().step_rows(); })
      .def_property_readonly("table_local_rows", [](FrontendSync& s) { return s.tables().local_rows(); });
}

void BindClickLog(py::module_& m) {
  // The click log with a known answer (common/data/click/click_log.h), for the DLRM-style examples.
  py::class_<ClickLog, std::shared_ptr<ClickLog>>(m, "ClickLog")
      .def(py::init([](int num_dense, int num_categorical, std::vector<int64_t> ids_per_feature, double zipf_s,
                       double planted_scale, uint64_t seed) {
             ClickLogOptions o;
             o.num_dense = num_dense;
             o.num_categorical = num_categorical;
             o.ids_per_feature = std::move(ids_per_feature);
             o.zipf_s = zipf_s;
             o.planted_scale = planted_scale;
             o.seed = seed;
             Result<ClickLog> log = ClickLog::Create(o);
             ThrowIfError(log.status());
             return std::make_shared<ClickLog>(std::move(log).value());
           }),
           py::arg("num_dense") = 13, py::arg("num_categorical") = 26,
           py::arg("ids_per_feature") = std::vector<int64_t>{1000000}, py::arg("zipf_s") = 1.05,
           py::arg("planted_scale") = 0.25, py::arg("seed") = 0)
      .def_property_readonly_static("test_begin", [](py::object) { return ClickLog::kTestBegin; })
      .def(
          "fill",
          [](const ClickLog& log, int64_t begin, int64_t count) {
            if (begin < 0 || count < 0 || begin > (int64_t{1} << 62) - count) {
              ThrowIfError(InvalidArgumentError("fill: examples [begin, begin + count) must lie in [0, 2^62)"));
            }
            ClickBatch b;
            {
              py::gil_scoped_release release;
              log.Fill(begin, count, &b);
            }
            py::array_t<float> dense({static_cast<py::ssize_t>(count), static_cast<py::ssize_t>(b.num_dense)});
            std::copy(b.dense.begin(), b.dense.end(), dense.mutable_data());
            py::array_t<int64_t> ids({static_cast<py::ssize_t>(count), static_cast<py::ssize_t>(b.num_categorical)});
            std::copy(b.ids.begin(), b.ids.end(), ids.mutable_data());
            py::array_t<float> labels(static_cast<py::ssize_t>(count));
            std::copy(b.labels.begin(), b.labels.end(), labels.mutable_data());
            py::array_t<float> probability(static_cast<py::ssize_t>(count));
            std::copy(b.probability.begin(), b.probability.end(), probability.mutable_data());
            return py::make_tuple(dense, ids, labels, probability);
          },
          py::arg("begin"), py::arg("count"),
          "Examples [begin, begin + count): (dense float32 [n, num_dense], ids int64 [n, num_categorical], labels "
          "float32 [n], the planted model's probability float32 [n]).")
      .def(
          "oracle",
          [](const ClickLog& log, int64_t begin, int64_t count) {
            ClickOracleMetrics o;
            {
              py::gil_scoped_release release;
              o = log.OracleMetrics(begin, count);
            }
            py::dict d;
            d["auc"] = o.auc;
            d["log_loss"] = o.log_loss;
            d["positive_rate"] = o.positive_rate;
            return d;
          },
          py::arg("begin"), py::arg("count"), "The planted model's AUC and log loss on the examples: the best achievable.")
      .def("ids", &ClickLog::ids, py::arg("field"));
  m.def(
      "auc",
      [](const Floats& scores, const Floats& labels) {
        if (scores.size() != labels.size()) ThrowIfError(InvalidArgumentError("auc: scores and labels differ in length"));
        std::vector<int32_t> l(static_cast<size_t>(labels.size()));
        for (size_t i = 0; i < l.size(); ++i) l[i] = labels.data()[i] > 0.5f;
        return Auc({scores.data(), static_cast<size_t>(scores.size())}, l);
      },
      py::arg("scores"), py::arg("labels"), "The area under the ROC curve (common/data/binary_metrics.h).");
}

}  // namespace gradsync::python
