#include "experiments/spec/progress.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "common/obs/metrics.h"

namespace gradsync {
namespace {

std::string Percent(double a) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(2);
  s << 100 * a << "%";
  return s.str();
}

std::string Fixed4(double v) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(4);
  s << v;
  return s.str();
}

}  // namespace

ProgressLine::ProgressLine(std::ostream& out, std::string label, int epochs, int64_t max_steps, std::string csv)
    : out_(out),
      label_(std::move(label)),
      epochs_(epochs),
      max_steps_(max_steps),
      csv_(std::move(csv)),
      tty_(&out == &std::cout && ::isatty(1)),
      accuracy_(NAN) {}

void ProgressLine::Tick() {
  std::ifstream f(csv_);
  if (!f) return Print(false);
  f.seekg(offset_);
  std::string line;
  bool new_eval = false;
  while (std::getline(f, line)) {
    if (f.eof()) break;  // a row still being written
    offset_ += static_cast<std::streamoff>(line.size() + 1);
    const std::vector<std::string> v = SplitCsv(line);
    if (v.size() != kMetricsColumns || v[kColRun] == "run") continue;
    try {
      epoch_ = std::stod(v[kColEpoch]);
      step_ = std::stoll(v[kColStep]);
      if (!v[kColTestAccuracy].empty()) {
        accuracy_ = std::stod(v[kColTestAccuracy]);
        auc_ = v[kColTestAuc].empty() ? NAN : std::stod(v[kColTestAuc]);
        eval_step_ = step_;
        new_eval = true;
      }
    } catch (const std::exception&) {
    }
  }
  Print(new_eval);
}

void ProgressLine::SetNote(std::string note) {
  note_changed_ = note_changed_ || note != note_;
  note_ = std::move(note);
}

void ProgressLine::Done(const Status& s) {
  if (tty_) out_ << "\r\033[K";
  out_ << label_ << "  " << (s.ok() ? "done" : "FAILED") << " in " << Elapsed() << " s";
  if (!std::isnan(accuracy_)) out_ << ", test accuracy " << Percent(accuracy_);
  if (!std::isnan(auc_)) out_ << ", test AUC " << Fixed4(auc_);
  if (!s.ok()) out_ << ": " << s.message();
  out_ << std::endl;
}

long ProgressLine::Elapsed() const {
  return std::lround(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

void ProgressLine::Print(bool new_eval) {
  // With a terminal, a line redrawn in place; without, a line per evaluation, at most one
  // every 10 s, and one for each new note.
  if (!tty_) {
    if (note_changed_ && !note_.empty()) {
      note_changed_ = false;  // a new word from srun: at once
    } else if (!new_eval || std::chrono::steady_clock::now() < next_line_) {
      return;
    }
    next_line_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  }
  double frac = epochs_ > 0 ? epoch_ / epochs_ : 0;
  if (max_steps_ > 0) frac = std::max(frac, static_cast<double>(step_) / static_cast<double>(max_steps_));
  frac = std::min(1.0, frac);
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(2);
  line << label_ << "  epoch " << epoch_;
  if (epochs_ > 0) line << "/" << epochs_;
  line << "  step " << step_ << "  test acc " << (std::isnan(accuracy_) ? std::string("—") : Percent(accuracy_));
  if (!std::isnan(auc_)) line << "  AUC " << Fixed4(auc_);
  // Training done, its last evaluation not yet written: the workers are evaluating, not stuck.
  if (frac >= 1.0 && eval_step_ < step_) line << " (evaluating)";
  line << "  " << Elapsed() << " s elapsed";
  if (frac > 0.02) line << ", ~" << std::lround(Elapsed() * (1 - frac) / frac) << " s left";
  if (!note_.empty()) line << "  (" << note_ << ")";
  if (tty_) out_ << "\r\033[K" << line.str() << std::flush;
  else out_ << line.str() << std::endl;
}

}  // namespace gradsync
