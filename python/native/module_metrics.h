// gradsync._native's metrics rows and worker summary, as gradsync-worker writes them: a step's
// SyncStepStats as the dict Python's Recorder keeps (StatsDict), MetricsWriter and
// write_worker_summary reading such dicts back (a row's or the summary's). Each field crosses
// under one name both ways (MetricsRow::RowReads: PutRowReads, RowReadsFrom). Called by
// module.cc's module definition.
#pragma once

#include <pybind11/pybind11.h>

#include "worker/sync/gradient_sync.h"

namespace gradsync::python {

// A step's stats as a dict (the metrics row's names).
pybind11::dict StatsDict(const SyncStepStats& s);
void BindMetrics(pybind11::module_& m);

}  // namespace gradsync::python
