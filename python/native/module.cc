// gradsync._native: the pybind11 binding of python/native/frontend.h and the codecs (the metrics
// and summary writers: module_metrics.h; the tables: module_tables.h). Blocking calls release the
// GIL. A failed call raises ValueError (kInvalidArgument: bad use, bad settings) or
// gradsync._native.GradsyncError (a RuntimeError: the job failed, a peer was lost, a deadline
// passed); the message is the Status's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>

#include "common/config/train_config.h"
#include "common/data/dataset_cache.h"
#include "common/data/idx.h"
#include "common/obs/metrics.h"
#include "common/obs/process_summary.h"
#include "common/obs/trace.h"
#include "common/optim/optimizer.h"
#include "compression/compressor.h"
#include "python/native/frontend.h"
#include "python/native/module_metrics.h"
#include "python/native/module_tables.h"

namespace py = pybind11;

namespace gradsync::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// A view of `span` as a 1-D float32 numpy array that keeps `owner` alive (no copy).
py::array_t<float> View(FloatSpan span, py::object owner) {
  return py::array_t<float>({static_cast<py::ssize_t>(span.size())}, {static_cast<py::ssize_t>(sizeof(float))},
                            span.data(), owner);
}

// The set and default values of a proto's fields, by name (scalars and enums by name).
py::dict FieldsDict(const google::protobuf::Message& m) {
  namespace pb = google::protobuf;
  py::dict d;
  const pb::Descriptor* desc = m.GetDescriptor();
  const pb::Reflection* r = m.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const pb::FieldDescriptor* f = desc->field(i);
    if (f->is_repeated()) continue;
    const char* name = f->name().c_str();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_BOOL: d[name] = r->GetBool(m, f); break;
      case pb::FieldDescriptor::CPPTYPE_INT32: d[name] = r->GetInt32(m, f); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: d[name] = r->GetInt64(m, f); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: d[name] = r->GetUInt32(m, f); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: d[name] = r->GetUInt64(m, f); break;
      // A float as its shortest exact text reads (0.02, not 0.019999999552965164).
      case pb::FieldDescriptor::CPPTYPE_FLOAT: d[name] = std::stod(ShortestText(r->GetFloat(m, f))); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: d[name] = r->GetDouble(m, f); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: d[name] = r->GetString(m, f); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: d[name] = r->GetEnum(m, f)->name(); break;
      default: break;
    }
  }
  return d;
}

// sync.optimizer_state()'s dict: {"kind": str, "scalars": {"step": int} (none before the first
// step), "tensor_steps": [int per tensor] (only when some tensor skipped steps: each one's own
// steps taken), "slots": {name: [one flat float32 array per tensor, in layout order]}}.
py::dict StateDict(const NamedOptimizerState& state) {
  py::dict scalars, slots;
  if (state.step) scalars["step"] = *state.step;
  for (const auto& [name, tensors] : state.slots) {
    py::list arrays;
    for (const auto& t : tensors) {
      py::array_t<float> a(static_cast<py::ssize_t>(t.size()));
      std::copy(t.begin(), t.end(), a.mutable_data());
      arrays.append(std::move(a));
    }
    slots[py::str(name)] = std::move(arrays);
  }
  py::dict d;
  d["kind"] = state.kind;
  d["scalars"] = std::move(scalars);
  if (!state.tensor_steps.empty()) d["tensor_steps"] = state.tensor_steps;
  d["slots"] = std::move(slots);
  return d;
}

// The same dict back (ValueError for what is not of that form; sizes and names are the sync's
// to check). Arrays of any float type and shape are read flat, as float32.
NamedOptimizerState StateFrom(const py::dict& d) {
  auto bad = [](const std::string& what) { return StatusError(InvalidArgumentError("optimizer state: " + what)); };
  for (const auto& [key, value] : d) {
    const std::string k = py::str(key);
    if (k != "kind" && k != "scalars" && k != "slots" && k != "tensor_steps") {
      throw bad("unknown key '" + k + "' (kind, scalars, tensor_steps, slots)");
    }
  }
  if (!d.contains("kind") || !py::isinstance<py::str>(d["kind"])) throw bad("'kind' (a str) is missing");
  NamedOptimizerState s;
  s.kind = d["kind"].cast<std::string>();
  if (d.contains("scalars") && !d["scalars"].is_none()) {
    if (!py::isinstance<py::dict>(d["scalars"])) throw bad("'scalars' is not a dict");
    for (const auto& [key, value] : d["scalars"].cast<py::dict>()) {
      const std::string k = py::str(key);
      if (k != "step") throw bad("unknown scalar '" + k + "' (the shards keep 'step')");
      double v = 0;
      try {
        v = py::float_(py::reinterpret_borrow<py::object>(value));  // an int, a float, a 0-d tensor
      } catch (const py::error_already_set&) {
        throw bad("'step' is not a number");
      }
      if (!(v >= 0 && v <= 9.0e15) || v != std::floor(v)) throw bad("'step' must be a whole number >= 0");
      s.step = static_cast<int64_t>(v);
    }
  }
  if (d.contains("tensor_steps") && !d["tensor_steps"].is_none()) {
    try {
      s.tensor_steps = d["tensor_steps"].cast<std::vector<int64_t>>();
    } catch (const py::cast_error&) {
      throw bad("'tensor_steps' is not a list of whole numbers (one per tensor)");
    }
  }
  if (d.contains("slots") && !d["slots"].is_none()) {
    if (!py::isinstance<py::dict>(d["slots"])) throw bad("'slots' is not a dict");
    for (const auto& [key, value] : d["slots"].cast<py::dict>()) {
      const std::string name = py::str(key);
      if (!py::isinstance<py::sequence>(value) || py::isinstance<py::str>(value)) {
        throw bad("slot '" + name + "' is not a list of arrays (one per tensor)");
      }
      auto& tensors = s.slots[name];
      for (const auto& item : value.cast<py::sequence>()) {
        py::array_t<float, py::array::c_style | py::array::forcecast> a;
        try {
          a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(item);
        } catch (const py::error_already_set&) {
        }
        if (!a) throw bad("slot '" + name + "': an entry is not an array of numbers");
        tensors.emplace_back(a.data(), a.data() + a.size());
      }
    }
  }
  return s;
}


// Errors: a failed Status raises ValueError (kInvalidArgument) or gradsync._native.GradsyncError.
void BindErrors(py::module_& m) {
  static py::exception<StatusError> gradsync_error(m, "GradsyncError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(e.code() == StatusCode::kInvalidArgument ? PyExc_ValueError : gradsync_error.ptr(), e.what());
    }
  });
}

// Job's collectives: gather and all-gather (bytes), broadcast and all-reduce (in place).
void BindJobCollectives(py::class_<FrontendJob>& job) {
  job.def(
          "gather",
          [](FrontendJob& j, const std::string& name, const py::bytes& data, double timeout_s) {
            std::string in = data;
            std::vector<std::string> out;
            {
              py::gil_scoped_release release;
              out = j.Gather(name, in, timeout_s);
            }
            py::list l;
            for (const auto& s : out) l.append(py::bytes(s));
            return l;
          },
          py::arg("name"), py::arg("data"), py::arg("timeout_s") = 600.0)
      .def(
          "broadcast",
          [](FrontendJob& j, py::buffer data, int root) {
            py::buffer_info info = data.request(/*writable=*/true);
            if (info.ndim != 1 || info.strides[0] != info.itemsize) throw StatusError(InvalidArgumentError("broadcast: a contiguous 1-D buffer"));
            std::span<std::byte> bytes(static_cast<std::byte*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
            py::gil_scoped_release release;
            j.Broadcast(bytes, root);
          },
          py::arg("data"), py::arg("root") = 0,
          "Overwrites `data` (a writable contiguous buffer, size a multiple of 4) with root's, in place.")
      .def(
          "allreduce",
          [](FrontendJob& j, py::array_t<float, py::array::c_style> data, const std::string& op) {
            if (op != "average" && op != "sum") throw StatusError(InvalidArgumentError("allreduce: op '" + op + "': average or sum"));
            py::buffer_info info = data.request(/*writable=*/true);
            FloatSpan span(static_cast<float*>(info.ptr), static_cast<size_t>(info.size));
            py::gil_scoped_release release;
            j.AllReduce(span, op == "sum" ? ReduceOp::kSum : ReduceOp::kAverage);
          },
          py::arg("data").noconvert(), py::arg("op") = "average",
          "Averages (op='average') or sums a float32 array over the ring, in place (mode allreduce).")
      .def(
          "allgather",
          [](FrontendJob& j, const py::bytes& data, bool via_scheduler) {
            std::string in = data;
            std::vector<std::string> out;
            {
              py::gil_scoped_release release;
              out = j.AllGather(in, via_scheduler);
            }
            py::list l;
            for (const auto& s : out) l.append(py::bytes(s));
            return l;
          },
          py::arg("data"), py::arg("via_scheduler") = false,
          "Every worker's bytes, by rank (sizes may differ): the ring (mode allreduce) or the scheduler.");
}

void BindJob(py::module_& m) {
  py::class_<FrontendJob> job(m, "Job");
  job.def(py::init<const std::vector<std::string>&>(), py::arg("argv"), Release())
      .def_property_readonly("rank", &FrontendJob::rank)
      .def_property_readonly("size", &FrontendJob::size)
      .def_property_readonly("mode", [](const FrontendJob& j) { return ModeName(j.mode()); })
      .def_property_readonly("staleness", &FrontendJob::staleness)
      .def_property_readonly("config",
                             [](FrontendJob& j) {
                               py::dict d = FieldsDict(j.train());
                               d["overlap"] = OverlapOf(j.train(), j.link().oversubscribed);  // as it applies
                               return d;
                             })
      .def_property_readonly("process", [](const FrontendJob& j) { return FieldsDict(j.process()); });
  BindJobCollectives(job);
  job.def("training_ended", &FrontendJob::TrainingEnded, py::arg("steps"), py::arg("joined"), Release())
      .def_property_readonly("worker_hosts", &FrontendJob::WorkerHosts)
      .def_property_readonly(
          "ended_workers",
          [](const FrontendJob& j) {
            py::list l;
            for (const auto& e : j.EndedWorkers()) l.append(py::make_tuple(e.rank, e.clock, e.joined));
            return l;
          },
          "PS modes: (rank, steps, joined) of every worker that ended training, as the scheduler told.")
      .def(
          "finished",
          [](FrontendJob& j, const std::string& error) {
            j.Finished(error.empty() ? OkStatus() : AbortedError(error));
          },
          py::arg("error") = "", Release());
}

// Sync's bytes moved and replies counted.
void BindSyncTraffic(py::class_<FrontendSync>& sync) {
  sync.def("traffic", [](const FrontendSync& s) {
        const SyncTraffic t = s.traffic();
        return py::make_tuple(t.bytes_sent, t.bytes_received);
      }, "(bytes sent, bytes received) on the wire")
      .def("shm_traffic", [](const FrontendSync& s) {
        const SyncTraffic t = s.traffic();
        return py::make_tuple(t.shm_bytes_sent, t.shm_bytes_received);
      }, "(bytes sent, bytes received) through shared memory with processes of this host, as the wire would count them")
      .def("reply_counts", [](const FrontendSync& s) {
        const PsClient::ReplyCounts c = s.reply_counts();
        py::dict d;
        d["pushes"] = c.pushes;
        d["pulls"] = c.pulls;
        d["version_lag"] = c.version_lag;
        d["clock_staleness"] = c.clock_staleness;
        return d;
      });
}

// Sync's optimizer state (PS modes: the shards').
void BindSyncOptimizerState(py::class_<FrontendSync>& sync) {
  sync.def(
          "optimizer_state",
          [](FrontendSync& s) {
            NamedOptimizerState state;
            {
              py::gil_scoped_release release;
              state = s.shard_state().Read();
            }
            return StateDict(state);
          },
          "PS modes: the shards' optimizer state at this worker's step, {'kind': 'sgd'|'adam', 'scalars': "
          "{'step': n}, 'slots': {name: [a flat float32 array per tensor, in layout order]}} (torch's names: "
          "'momentum_buffer'; 'exp_avg', 'exp_avg_sq'); before the first step no scalars and no slots.")
      .def(
          "set_optimizer_state",
          [](FrontendSync& s, const py::dict& d) {
            NamedOptimizerState state = StateFrom(d);
            py::gil_scoped_release release;
            s.shard_state().SetOptimizerState(std::move(state));
          },
          py::arg("state"), "PS modes: sets the shards' optimizer state (the dict optimizer_state() returns).")
      .def("set_parameters", [](FrontendSync& s) { s.shard_state().SetParameters(); }, Release(),
           "PS modes: the shards' parameters become this process's (params); the optimizer state stays. The step's "
           "pulls must have landed first.");
}

void BindSync(py::module_& m) {
  py::class_<OptimizerSpec>(m, "OptimizerSpec")
      .def(py::init<>())
      .def_readwrite("kind", &OptimizerSpec::kind)
      .def_readwrite("lr", &OptimizerSpec::lr)
      .def_readwrite("momentum", &OptimizerSpec::momentum)
      .def_readwrite("nesterov", &OptimizerSpec::nesterov)
      .def_readwrite("weight_decay", &OptimizerSpec::weight_decay)
      .def_readwrite("beta1", &OptimizerSpec::beta1)
      .def_readwrite("beta2", &OptimizerSpec::beta2)
      .def_readwrite("eps", &OptimizerSpec::eps);

  py::class_<FrontendSync> sync(m, "Sync");
  sync.def(py::init([](FrontendJob* job, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                       const OptimizerSpec& optimizer, const std::string& compression, int error_feedback,
                       const std::vector<TableSpec>& tables) {
             std::vector<TensorSpec> specs;
             for (const auto& [name, shape] : tensors) specs.push_back({name, shape});
             py::gil_scoped_release release;
             return std::make_unique<FrontendSync>(job, specs, optimizer, compression, error_feedback, tables);
           }),
           py::arg("job"), py::arg("tensors"), py::arg("optimizer"), py::arg("compression") = "",
           py::arg("error_feedback") = -1, py::arg("tables") = std::vector<TableSpec>{}, py::keep_alive<1, 2>())
      .def_property_readonly("params", [](py::object self) { return View(self.cast<FrontendSync&>().params(), self); })
      .def_property_readonly("grads", [](py::object self) { return View(self.cast<FrontendSync&>().grads(), self); })
      .def_property_readonly("offsets", [](const FrontendSync& s) {
        std::vector<int64_t> o;
        for (const auto& t : s.layout()) o.push_back(t.offset);
        return o;
      })
      .def_property_readonly("overlapped", &FrontendSync::overlapped)
      .def_property_readonly("sync_every", &FrontendSync::sync_every)
      .def("straggle", &FrontendSync::Straggle, py::arg("compute_ms"), Release(),
           "Sleeps the job's injected delay (--straggle) for a step that computed compute_ms; returns the ms slept")
      .def_property_readonly("kind", &FrontendSync::kind)
      .def("start", &FrontendSync::Start, py::arg("total_steps") = 0, py::arg("steps_per_epoch") = 1, Release())
      .def("begin_step", &FrontendSync::BeginStep, py::arg("step"), py::arg("evaluate") = false,
           py::arg("lr") = NAN, Release())
      .def("wait_params", &FrontendSync::WaitParams, Release())
      .def("grad_ready", &FrontendSync::GradReady, Release())
      .def("grad_absent", &FrontendSync::GradAbsent, Release())
      .def("finish_step", [](FrontendSync& s) {
        SyncStepStats stats;
        {
          py::gil_scoped_release release;
          stats = s.FinishStep();
        }
        return StatsDict(stats);
      })
      .def("abandon_step", &FrontendSync::AbandonStep, Release())
      .def("end_training", &FrontendSync::EndTraining, py::arg("evaluate") = false, py::arg("join") = false,
           Release(),
           "After the last step. join=True: this worker ran out of data (PS modes: it leaves the consistency "
           "rule, the others go on without it; returns once every worker has ended or joined).");
  BindSyncTraffic(sync);
  BindSyncOptimizerState(sync);
  BindTables(m, sync);
}

void BindBucketReducer(py::module_& m) {
  py::class_<FrontendBucketReducer>(m, "BucketReducer")
      .def(py::init<FrontendJob*, const std::string&, bool>(), py::arg("job"), py::arg("codec") = "",
           py::arg("error_feedback") = false, py::keep_alive<1, 2>())
      .def(
          "average",
          [](FrontendBucketReducer& r, py::array_t<float, py::array::c_style> bucket, size_t index, uint64_t step,
             const std::vector<std::vector<int64_t>>& shapes) {
            py::buffer_info info = bucket.request(/*writable=*/true);
            FloatSpan span(static_cast<float*>(info.ptr), static_cast<size_t>(info.size));
            py::gil_scoped_release release;
            r.Average(span, index, step, shapes);
          },
          py::arg("bucket").noconvert(), py::arg("index"), py::arg("step"),
          py::arg("shapes") = std::vector<std::vector<int64_t>>{},
          "Averages a float32 buffer over the ring in place (its own encoder per bucket index); PowerSGD needs "
          "`shapes`, the bucket's tensors' shapes in order.")
      .def_property_readonly("needs_shapes", &FrontendBucketReducer::needs_shapes)
      .def("traffic", [](const FrontendBucketReducer& r) {
        const SyncTraffic t = r.traffic();
        return py::make_tuple(t.bytes_sent, t.bytes_received);
      }, "(bytes sent, bytes received) on the wire")
      .def("shm_traffic", [](const FrontendBucketReducer& r) {
        const SyncTraffic t = r.traffic();
        return py::make_tuple(t.shm_bytes_sent, t.shm_bytes_received);
      }, "(bytes sent, bytes received) through shared memory with processes of this host");
}

void BindCodecs(py::module_& m) {
  // The codecs themselves, for experiments from Python: a payload per call, as the wire carries it.
  py::class_<Compressor>(m, "Codec")
      .def(py::init([](const std::string& spec, uint64_t seed) {
             auto c = CreateCompressor(spec, seed);
             ThrowIfError(c.status());
             if (!*c) throw StatusError(InvalidArgumentError("'" + spec + "' is no codec (none: raw floats)"));
             return std::move(c).value();
           }),
           py::arg("spec"), py::arg("seed") = 0)
      .def_property_readonly("name", &Compressor::name)
      .def("payload_bytes", &Compressor::PayloadBytes, py::arg("n"))
      .def(
          "encode",
          [](Compressor& c, py::array_t<float, py::array::c_style | py::array::forcecast> x, uint64_t step) {
            std::vector<uint8_t> out;
            c.Encode(ConstFloatSpan(x.data(), static_cast<size_t>(x.size())), step, &out);
            return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
          },
          py::arg("x"), py::arg("step") = 0)
      .def(
          "decode",
          [](const Compressor& c, const py::bytes& payload, size_t n, uint64_t step) {
            const std::string_view p = payload;
            py::array_t<float> out(static_cast<py::ssize_t>(n));
            ThrowIfError(c.Decode(std::span(reinterpret_cast<const uint8_t*>(p.data()), p.size()), n, step,
                                  FloatSpan(out.mutable_data(), n)));
            return out;
          },
          py::arg("payload"), py::arg("n"), py::arg("step") = 0);
}

void BindData(py::module_& m) {
  // Fashion-MNIST as the files hold it, for the examples' data helpers: the pixels a read-only
  // view of the host's shared decoded copy (gradsync-worker's), so that N workers on a host hold
  // one copy, not N.
  m.def("default_data_cache", &DefaultDataCacheDir);
  m.def(
      "fashion_mnist",
      [](const std::string& data_dir, const std::string& split, const std::string& cache_dir) {
        if (split != "train" && split != "test") throw StatusError(InvalidArgumentError("split '" + split + "': train or test"));
        Result<Dataset> loaded = [&] {
          py::gil_scoped_release release;
          return LoadFashionMnist(data_dir, split == "train" ? Split::kTrain : Split::kTest, cache_dir);
        }();
        ThrowIfError(loaded.status());
        auto data = std::make_shared<const Dataset>(std::move(loaded).value());
        const py::ssize_t n = data->n, side = 28;
        py::capsule owner(new std::shared_ptr<const Dataset>(data),
                          [](void* p) { delete static_cast<std::shared_ptr<const Dataset>*>(p); });
        py::array_t<uint8_t> pixels({n, side, side}, {side * side, side, py::ssize_t{1}}, data->bytes.data(), owner);
        pixels.attr("setflags")(py::arg("write") = false);
        py::array_t<int64_t> labels(n);
        std::copy(data->labels.begin(), data->labels.end(), labels.mutable_data());
        return py::make_tuple(pixels, labels);
      },
      py::arg("data_dir"), py::arg("split"), py::arg("cache_dir"),
      "(pixels uint8 [n, 28, 28], read-only; labels int64 [n]) of Fashion-MNIST's train or test split in "
      "data_dir, through the shared decoded copy in cache_dir ('': this process's own)");
}

void BindLrSchedule(py::module_& m) {
  // The learning-rate schedules gradsync-worker's --lr-schedule names, for scripts that drive their
  // optimizer's rate from them (the examples' --lr-schedule): the worker's own formula.
  m.def(
      "lr_at",
      [](const std::string& schedule, double base, int64_t total_steps, int64_t step) {
        Result<LrSchedule::Kind> kind = ParseLrScheduleKind(schedule);
        ThrowIfError(kind.status());
        if (total_steps < 0 || step < 0) throw StatusError(InvalidArgumentError("lr_at: steps must be >= 0"));
        LrSchedule lr;
        lr.kind = *kind;
        lr.base = static_cast<float>(base);
        lr.total_steps = total_steps;
        return static_cast<double>(lr.At(step));
      },
      py::arg("schedule"), py::arg("base"), py::arg("total_steps"), py::arg("step"),
      "The learning rate at `step` (0-based) of `total_steps` under `schedule` (constant, cosine or linear, "
      "decaying to 0 at total_steps), as gradsync-worker computes it.");
}

void BindTrace(py::module_& m) {
  // Spans of the user's own code in this process's trace (gradsync.trace_span): the clock, and a
  // finished span. Nothing is recorded unless the job traces (gradsync-launch --trace).
  m.def("trace_on", &Trace::on);
  m.def("trace_now_us", &Trace::NowUs);
  m.def(
      "trace_complete",
      [](const std::string& name, const std::string& category, double begin_us) {
        if (Trace::on()) Trace::Complete(TraceName(name), TraceName(category), begin_us, Trace::NowUs() - begin_us);
      },
      py::arg("name"), py::arg("category"), py::arg("begin_us"));
}

}  // namespace
}  // namespace gradsync::python

PYBIND11_MODULE(_native, m) {
  using namespace gradsync;
  using namespace gradsync::python;
  m.doc() = "gradsync's native frontend (see the gradsync package)";

  BindErrors(m);
  BindJob(m);
  BindSync(m);
  BindBucketReducer(m);
  BindMetrics(m);
  BindCodecs(m);
  BindTrace(m);
  BindData(m);
  BindClickLog(m);
  BindLrSchedule(m);

  m.def(
      "encoded_bytes",
      [](const std::string& spec, size_t n) {
        auto c = CreateCompressor(spec, 0);
        ThrowIfError(c.status());
        if (!*c) return n * sizeof(float);
        return (*c)->PayloadBytes(n);
      },
      py::arg("codec"), py::arg("elements"),
      "Bytes of one payload of `elements` floats under `codec` (the wire formula; 'none': raw floats).");
}
