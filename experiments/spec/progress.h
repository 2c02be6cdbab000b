// A progress line for a job on this machine: follows worker 0's metrics file (worker-0.csv) as
// it grows and shows the epoch, step, latest test accuracy (and AUC, for a model with one), time
// elapsed and left. On a terminal one line redrawn in place; otherwise a line per evaluation, at
// most one every 10 s. Used by gradsync-run (each run) and gradsync-launch.
//
//   ProgressLine progress(std::cout, "[1/3] bsp", /*epochs=*/10, /*max_steps=*/0, dir + "/worker-0.csv");
//   launch.on_tick = [&] { progress.Tick(); };
//   ...
//   progress.Done(status);
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>

#include "common/base/status.h"

namespace gradsync {

class ProgressLine {
 public:
  // `epochs` 0: not known (no "/N", and time left only from max_steps); `max_steps` 0: none.
  ProgressLine(std::ostream& out, std::string label, int epochs, int64_t max_steps, std::string csv);

  // Reads what the file gained and redraws (or prints) the line.
  void Tick();
  // A word on the run's state shown after the numbers ("srun: job 12 queued and waiting for
  // resources"); "" for none.
  void SetNote(std::string note);
  // The last line: done or FAILED, the time and the last test accuracy.
  void Done(const Status& s);
  bool tty() const { return tty_; }

 private:
  long Elapsed() const;
  void Print(bool new_eval);

  std::ostream& out_;
  std::string label_;
  int epochs_;
  int64_t max_steps_;
  std::string csv_;
  bool tty_;
  std::streamoff offset_ = 0;
  double epoch_ = 0;
  int64_t step_ = 0;
  int64_t eval_step_ = -1;  // the step of the last evaluation row read
  double accuracy_;
  double auc_ = NAN;  // the last evaluation's test AUC (a model that scores by a probability)
  std::string note_;
  bool note_changed_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point next_line_ = start_;
};

}  // namespace gradsync
