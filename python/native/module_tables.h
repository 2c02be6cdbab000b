// gradsync._native's embedding tables (python/native/frontend_tables.h) and the click log they
// train on (common/data/click/click_log.h): TableSpec, Sync.read_rows / set_row_grads / table_step_rows,
// ClickLog, auc and log_loss. Called by module.cc's module definition.
#pragma once

#include <pybind11/pybind11.h>

#include "python/native/frontend.h"

namespace gradsync::python {

void BindTables(pybind11::module_& m, pybind11::class_<FrontendSync>& sync);
void BindClickLog(pybind11::module_& m);

}  // namespace gradsync::python
