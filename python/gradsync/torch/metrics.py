"""Per-step metrics rows and the worker summary, in the C++ worker's formats: OUT/worker-<rank>.csv
(the columns of MetricsWriter, ARCHITECTURE.md "Outputs") and OUT/worker-<rank>.json, so that
gradsync-run's summary and plots read a Python worker as they read gradsync-worker.

The summary's figures are the metrics file's last row's (steps, bytes on the wire and through
shared memory): the last training row is held until the next row or the end, and the end stamps
it with the bytes the end of training moved (the final pull, the barrier), as the C++ worker's
row after its end holds them."""

import math
import os
import time

from gradsync import _native


class Recorder:
    """Writes rows when the job has an output directory (--out / GRADSYNC_OUT); otherwise only
    keeps the numbers (last_row)."""

    def __init__(self, job, num_params, steps_per_epoch=None):
        self._job = job
        process = job.process
        self._out = process.get("out", "")
        self._rank = job.rank
        self._run = process.get("run", "") or job.mode
        self._num_params = num_params
        self.steps_per_epoch = steps_per_epoch
        self._writer = None
        if self._out:
            self._writer = _native.MetricsWriter(
                os.path.join(self._out, "worker-%d.csv" % self._rank), self._run, self._rank)
        self._start = time.perf_counter()
        self._loss_sum = 0.0
        self._loss_count = 0
        self.steps = 0
        self.final_test_accuracy = math.nan
        self.last_row = None
        self._held = None  # the last training row, not written yet
        # PS with tables: the reads of rows over the run (every step's stats summed, as the C++
        # worker's EpochReporter sums them); read_staleness the largest.
        self.row_reads = dict(rows_pulled=0, cache_hits=0, cache_saved_bytes=0, read_staleness=-1)
        self._written = None  # the last row written: the summary's figures are its

    def wall_s(self):
        return time.perf_counter() - self._start

    def _epoch(self, step):
        return step / self.steps_per_epoch if self.steps_per_epoch else 0.0

    def step(self, step, stats, compute_ms, loss=None):
        """A training row for `step` (steps finished, 1-based) with the sync's stats."""
        self.steps = step
        if loss is not None and math.isfinite(loss):
            self._loss_sum += loss
            self._loss_count += 1
        for k in ("rows_pulled", "cache_hits", "cache_saved_bytes"):
            self.row_reads[k] += int(stats.get(k, 0))
        self.row_reads["read_staleness"] = max(self.row_reads["read_staleness"], int(stats.get("read_staleness", -1)))
        row = dict(stats)
        row.update(step=step, epoch=self._epoch(step), wall_s=self.wall_s(),
                   loss=math.nan if loss is None else loss, compute_ms=compute_ms)
        self.last_row = row
        self._write_held()
        self._held = row

    def _write_held(self):
        if self._held is not None:
            if self._writer:
                self._writer.write(self._held)
            self._written, self._held = self._held, None

    def evaluation(self, step, test_loss, test_accuracy, traffic, shm=(0, 0), test_auc=math.nan):
        """An evaluation row: `loss` is the mean training loss since the previous one."""
        mean_loss = self._loss_sum / self._loss_count if self._loss_count else math.nan
        self._loss_sum, self._loss_count = 0.0, 0
        self.final_test_accuracy = test_accuracy
        row = dict(step=step, epoch=self._epoch(step), wall_s=self.wall_s(), loss=mean_loss,
                   test_loss=test_loss, test_accuracy=test_accuracy, test_auc=test_auc,
                   bytes_sent=traffic[0], bytes_received=traffic[1], shm_bytes_sent=shm[0],
                   shm_bytes_received=shm[1])
        self._write_held()
        if self._writer:
            self._writer.write(row)
            self._writer.flush()
        self._written = row
        return mean_loss

    def finish(self, traffic, error=None, replies=None, params_sha256=None, shm=(0, 0)):
        """OUT/worker-<rank>.json (nothing without an output directory), after the held training
        row, which takes the end's totals (`traffic`, `shm`: the bytes moved so far). The summary's
        steps and bytes are the last row's. replies: the sync's reply_counts() (PS modes);
        params_sha256: of the final parameters."""
        if self._held is not None:
            self._held.update(bytes_sent=traffic[0], bytes_received=traffic[1], shm_bytes_sent=shm[0],
                              shm_bytes_received=shm[1])
            self._write_held()
        if self._writer:
            self._writer.flush()
        if not self._out:
            return
        last = self._written or dict(step=self.steps, bytes_sent=traffic[0], bytes_received=traffic[1],
                                     shm_bytes_sent=shm[0], shm_bytes_received=shm[1])
        summary = dict(rank=self._rank, mode=self._job.mode, params=self._num_params,
                       steps=last["step"], wall_s=self.wall_s(), final_test_accuracy=self.final_test_accuracy)
        for k in ("bytes_sent", "bytes_received", "shm_bytes_sent", "shm_bytes_received"):
            summary[k] = int(last.get(k, 0))
        if replies is not None:
            summary["replies"] = replies
        if params_sha256:
            summary["params_sha256"] = params_sha256
        summary["row_reads"] = dict(self.row_reads)
        if self._job.mode == "ssp":
            summary["staleness_bound"] = self._job.staleness
        if error:
            summary["error"] = error
        _native.write_worker_summary(self._out, summary)
