#include "experiments/trace/trace_merge.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <sstream>

#include "common/obs/trace.h"
#include "experiments/process/process.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;

// A JSON value of a trace event line: a string, a number, null/true/false, or (one level down) an
// object of such values.
struct JsonMember;
struct JsonValue {
  enum Kind { kString, kNumber, kOther, kObject } kind = kOther;
  std::string text;
  double number = 0;
  std::vector<JsonMember> object;  // complete below, before any use

  const JsonValue* Field(const std::string& key) const;
  std::string Text(const std::string& key) const;
  double Number(const std::string& key, double missing) const;
};
struct JsonMember {
  std::string key;
  JsonValue value;
};

const JsonValue* JsonValue::Field(const std::string& key) const {
  for (const auto& m : object)
    if (m.key == key) return &m.value;
  return nullptr;
}
std::string JsonValue::Text(const std::string& key) const {
  const JsonValue* v = Field(key);
  return v != nullptr && v->kind == kString ? v->text : "";
}
double JsonValue::Number(const std::string& key, double missing) const {
  const JsonValue* v = Field(key);
  return v != nullptr && v->kind == kNumber ? v->number : missing;
}

// A parser of one line's object: what Trace writes (strings, numbers, an args object), strictly.
class LineParser {
 public:
  explicit LineParser(std::string_view s) : s_(s) {}

  // The whole of `s` as one object; false (with why()) otherwise.
  bool Parse(JsonValue* out) {
    if (!Value(out, 0)) return false;
    Ws();
    if (i_ != s_.size()) return Fail("text after the object");
    if (out->kind != JsonValue::kObject) return Fail("not an object");
    return true;
  }
  const std::string& why() const { return why_; }

 private:
  bool Fail(const std::string& why) {
    if (why_.empty()) why_ = why + " at column " + std::to_string(i_ + 1);
    return false;
  }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    Ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return Fail("a string expected");
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      c = s_[i_++];
      switch (c) {
        case 'n': *out += '\n'; break;
        case 't': *out += '\t'; break;
        case 'r': *out += '\r'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) return Fail("a cut \\u escape");
          unsigned code = 0;
          auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + i_ + 4, code, 16);
          if (ec != std::errc() || end != s_.data() + i_ + 4) return Fail("a bad \\u escape");
          i_ += 4;
          *out += code < 0x80 ? static_cast<char>(code) : '?';
          break;
        }
        default: *out += c;  // \" \\ \/
      }
    }
    if (i_ >= s_.size()) return Fail("an unterminated string");
    ++i_;
    return true;
  }
  bool Value(JsonValue* v, int depth) {
    Ws();
    if (i_ >= s_.size()) return Fail("a value expected");
    const char c = s_[i_];
    if (c == '"') {
      v->kind = JsonValue::kString;
      return String(&v->text);
    }
    if (c == '{') {
      if (depth > 1) return Fail("objects nested too deep");
      ++i_;
      v->kind = JsonValue::kObject;
      if (Eat('}')) return true;
      do {
        std::string key;
        if (!String(&key)) return false;
        if (!Eat(':')) return Fail("':' expected");
        JsonValue value;
        if (!Value(&value, depth + 1)) return false;
        v->object.push_back({std::move(key), std::move(value)});
      } while (Eat(','));
      return Eat('}') || Fail("'}' expected");
    }
    for (const char* word : {"null", "true", "false"}) {
      if (s_.substr(i_).starts_with(word)) {
        i_ += std::strlen(word);
        v->kind = JsonValue::kOther;
        return true;
      }
    }
    const char* begin = s_.data() + i_;
    auto [end, ec] = std::from_chars(begin, s_.data() + s_.size(), v->number);
    if (ec != std::errc()) return Fail("a value expected");
    i_ += static_cast<size_t>(end - begin);
    v->kind = JsonValue::kNumber;
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string why_;
};

// Reads `path` line by line: the header line, one event object per line (a separating comma
// before or after it), the closing line; `fn(event, line_number)` for each event.
Status ForEachEventLine(const std::string& path, const std::function<Status(const JsonValue&, int)>& fn) {
  std::ifstream f(path);
  if (!f) return fs::exists(path) ? UnavailableError("cannot read " + path) : NotFoundError(path + " does not exist");
  auto broken = [&](int line, const std::string& why) {
    return DataLossError(path + ":" + std::to_string(line) + ": not a trace file as gradsync writes them (one event per line): " + why);
  };
  std::string line;
  int number = 0;
  bool header = false, closed = false;
  while (std::getline(f, line)) {
    ++number;
    std::string_view v = line;
    while (!v.empty() && (v.front() == ' ' || v.front() == ',')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == ',' || v.back() == '\r')) v.remove_suffix(1);
    if (v.empty()) continue;
    if (!header) {
      if (!v.starts_with("{") || !v.ends_with("\"traceEvents\": [")) return broken(number, "no traceEvents list opens it");
      header = true;
      continue;
    }
    if (closed) return broken(number, "text after the list's end");
    if (v == "]}") {
      closed = true;
      continue;
    }
    JsonValue event;
    LineParser parser(v);
    if (!parser.Parse(&event)) return broken(number, parser.why());
    RETURN_IF_ERROR(fn(event, number));
  }
  if (!header) return broken(number, "it is empty");
  if (!closed) return broken(number, "it is cut short (a process killed before it wrote its trace leaves FILE.partial)");
  return OkStatus();
}

}  // namespace

double TraceEvent::Arg(const std::string& key, double missing) const {
  auto it = args.find(key);
  return it == args.end() ? missing : it->second;
}

int LoadedTrace::Process(const std::string& name) const {
  auto it = std::find(processes.begin(), processes.end(), name);
  return it == processes.end() ? -1 : static_cast<int>(it - processes.begin());
}

Result<LoadedTrace> LoadTrace(const std::string& path) {
  LoadedTrace out;
  std::map<int, int> index_of_pid;
  std::map<int, double> correction;  // pid -> microseconds to add (Trace::RefineClockOffset)
  std::vector<int> pid_of_event;
  auto process = [&](int pid) {
    auto [it, added] = index_of_pid.emplace(pid, static_cast<int>(out.processes.size()));
    if (added) {
      out.processes.push_back("process " + std::to_string(pid));
      out.clock_error_us.push_back(-1);
    }
    return it->second;
  };
  RETURN_IF_ERROR(ForEachEventLine(path, [&](const JsonValue& e, int line) -> Status {
    const std::string ph = e.Text("ph");
    const int pid = static_cast<int>(e.Number("pid", 0));
    const JsonValue* args = e.Field("args");
    if (ph == "M") {
      if (args == nullptr || args->kind != JsonValue::kObject) return OkStatus();
      if (e.Text("name") == "process_name") {
        out.processes[static_cast<size_t>(process(pid))] = args->Text("name");
      } else if (e.Text("name") == "clock_correction") {
        const double us = args->Number("us", NAN);
        if (!std::isfinite(us)) return DataLossError(path + ":" + std::to_string(line) + ": a clock_correction that is not a number");
        correction[pid] += us;
        out.clock_error_us[static_cast<size_t>(process(pid))] = args->Number("error_us", -1);
      }
      return OkStatus();
    }
    if (ph != "X" && ph != "i") return OkStatus();
    TraceEvent t;
    t.name = e.Text("name");
    t.category = e.Text("cat");
    t.process = process(pid);
    t.thread = static_cast<int>(e.Number("tid", 0));
    t.instant = ph == "i";
    t.ts_us = e.Number("ts", NAN);
    t.dur_us = t.instant ? 0 : e.Number("dur", 0);
    if (!std::isfinite(t.ts_us) || !std::isfinite(t.dur_us) || t.dur_us < 0) {
      return DataLossError(path + ":" + std::to_string(line) + ": event '" + t.name + "' has no valid ts/dur");
    }
    if (args != nullptr) {
      for (const auto& m : args->object) {
        if (m.value.kind == JsonValue::kNumber) t.args[m.key] = m.value.number;
      }
    }
    out.events.push_back(std::move(t));
    pid_of_event.push_back(pid);
    return OkStatus();
  }));
  // The clock correction a process recorded at its end (anywhere in the file) applies to all of it.
  for (size_t i = 0; i < out.events.size(); ++i) {
    if (auto c = correction.find(pid_of_event[i]); c != correction.end()) out.events[i].ts_us += c->second;
  }
  return out;
}

Result<MergeStats> MergeTraces(const std::vector<std::string>& inputs, const std::string& out) {
  MergeStats stats;
  std::vector<std::string> present;
  for (const auto& path : inputs) (fs::exists(path) ? present : stats.missing).push_back(path);
  // Time from the job's first event (every file is on the scheduler's clock already). One file
  // in memory at a time: read twice, for the origin, then to write it.
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& path : present) {
    ASSIGN_OR_RETURN(LoadedTrace t, LoadTrace(path));
    for (const auto& e : t.events) origin = std::min(origin, e.ts_us);
  }
  if (!std::isfinite(origin)) origin = 0;
  const std::string partial = out + ".partial";
  std::ofstream file(partial, std::ios::trunc);
  if (!file) return UnavailableError("cannot create " + partial + ": " + std::strerror(errno));
  file << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  bool first = true;
  std::string text;
  auto add = [&](const std::string& event) {
    text += first ? "\n" : ",\n";
    text += event;
    first = false;
  };
  char buf[256];
  int pid = 0;
  for (const auto& path : present) {
    ASSIGN_OR_RETURN(LoadedTrace t, LoadTrace(path));
    text.clear();
    // One track per process file (a file holds one process), in the order given.
    const std::string name = t.processes.empty() ? "process " + std::to_string(pid) : t.processes.front();
    std::snprintf(buf, sizeof(buf), "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": ", pid);
    add(buf + TraceJsonString(name) + "}}");
    std::snprintf(buf, sizeof(buf), "{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": %d, \"tid\": 0, \"args\": {\"sort_index\": %d}}",
                  pid, pid);
    add(buf);
    if (!t.clock_error_us.empty() && t.clock_error_us.front() >= 0) {  // applied already: the bound stays
      std::snprintf(buf, sizeof(buf),
                    "{\"ph\": \"M\", \"name\": \"clock_correction\", \"pid\": %d, \"tid\": 0, \"args\": {\"us\": 0, \"error_us\": %.3f}}",
                    pid, t.clock_error_us.front());
      add(buf);
    }
    for (const auto& e : t.events) {
      std::string line = "{\"name\": " + TraceJsonString(e.name) + ", \"cat\": " + TraceJsonString(e.category);
      if (e.instant) {
        std::snprintf(buf, sizeof(buf), ", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d", e.ts_us - origin,
                      pid, e.thread);
      } else {
        std::snprintf(buf, sizeof(buf), ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                      e.ts_us - origin, e.dur_us, pid, e.thread);
      }
      line += buf;
      bool first_arg = true;
      for (const auto& [k, v] : e.args) {
        line += first_arg ? ", \"args\": {" : ", ";
        std::snprintf(buf, sizeof(buf), ": %.17g", v);
        line += TraceJsonString(k) + buf;
        first_arg = false;
      }
      if (!first_arg) line += "}";
      add(line + "}");
      ++stats.events;
    }
    file << text;
    ++pid;
    ++stats.processes;
  }
  file << "\n]}\n";
  file.close();
  if (!file) {
    std::remove(partial.c_str());
    return UnavailableError("cannot write " + out);
  }
  if (std::rename(partial.c_str(), out.c_str()) != 0) return UnavailableError("cannot write " + out + ": " + std::strerror(errno));
  return stats;
}

namespace {

// What a span is drawn as: its legend entry, colour and lane within its process's row (0: top,
// compute and apply; 1: sending and serving; 2: waiting). Spans that only enclose others (begin
// step, finish step, receive) are not drawn.
struct Look {
  const char* legend;
  const char* colour;
  int lane;
  int order;  // drawing order: enclosing spans first, so that what they hold is drawn over them
};

const Look* LookOf(const std::string& name) {
  static const std::map<std::string, Look> looks = {
      {"forward + backward", {"forward + backward", "#a0cbe8", 0, 0}},
      {"forward", {"forward", "#4e79a7", 0, 1}},
      {"backward", {"backward (per layer)", "#499894", 0, 2}},
      {"wait for parameters", {"forward waiting for a pulled layer", "#d9d9d9", 0, 3}},
      {"straggler delay", {"straggler delay", "#444444", 0, 3}},
      {"optimizer", {"optimizer", "#59a14f", 0, 4}},
      {"apply", {"apply", "#b07aa1", 0, 5}},
      {"apply round", {"apply", "#b07aa1", 0, 6}},
      {"checkpoint", {"checkpoint", "#9c755f", 0, 7}},
      {"push", {"push / all-reduce", "#f28e2b", 1, 8}},
      {"all-reduce bucket", {"push / all-reduce", "#f28e2b", 1, 9}},
      {"encode", {"encode / decode", "#edc948", 1, 10}},
      {"decode", {"encode / decode", "#edc948", 1, 11}},
      {"answer pull", {"answer pull", "#8cd17d", 1, 12}},
      {"validate", {"validate", "#17becf", 1, 13}},
      {"pull", {"pull (request to reply handled)", "#ffbe7d", 2, 14}},
      {"pull held", {"held by the consistency rule", "#e15759", 2, 15}},
      {"round wait", {"bsp round wait", "#9d2b2b", 2, 16}},
      {"recovery", {"recovery", "#ff9da7", 2, 17}},
  };
  auto it = looks.find(name);
  return it == looks.end() ? nullptr : &it->second;
}

// The first worker's steps: [start, end) of `steps` consecutive ones from the middle of the run.
std::pair<double, double> Window(const LoadedTrace& t, int steps) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& e : t.events) {
    lo = std::min(lo, e.ts_us);
    hi = std::max(hi, e.end_us());
  }
  int worker = -1;
  for (size_t p = 0; p < t.processes.size() && worker < 0; ++p) {
    if (t.processes[p].starts_with("worker")) worker = static_cast<int>(p);
  }
  std::map<int, std::pair<double, double>> by_step;  // step -> (begin, end)
  for (const auto& e : t.events) {
    if (e.process != worker || (e.name != "begin step" && e.name != "finish step")) continue;
    const int step = static_cast<int>(e.Arg("step"));
    auto [it, added] = by_step.emplace(step, std::make_pair(e.ts_us, e.end_us()));
    if (!added) {
      it->second.first = std::min(it->second.first, e.ts_us);
      it->second.second = std::max(it->second.second, e.end_us());
    }
  }
  if (by_step.size() < 2) return {lo, hi};
  std::vector<std::pair<double, double>> ordered;
  for (const auto& [step, span] : by_step) ordered.push_back(span);
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(1, steps)), ordered.size());
  const size_t first = (ordered.size() - n) / 2;
  return {ordered[first].first, ordered[first + n - 1].second};
}

}  // namespace

std::string TimelineScript(const LoadedTrace& t, const std::string& png, const std::string& data_path, int steps) {
  const auto [from, to] = Window(t, steps);
  double job_start = from;
  for (const auto& e : t.events) job_start = std::min(job_start, e.ts_us);
  const int rows = static_cast<int>(t.processes.size());
  // Bars by legend entry (one gnuplot data block each), in the order of first use.
  std::vector<std::string> legends;
  std::map<std::string, int> order;
  std::map<std::string, std::pair<std::string, std::ostringstream>> blocks;
  std::ostringstream failures;
  bool any_failure = false;
  for (const auto& e : t.events) {
    if (e.end_us() < from || e.ts_us > to) continue;
    const double row_base = rows - 1 - e.process;
    if (e.instant) {
      if (e.category != "failure") continue;
      failures << (e.ts_us - from) / 1e3 << " " << row_base + 0.5 << "\n";
      any_failure = true;
      continue;
    }
    const Look* look = LookOf(e.name);
    if (look == nullptr) continue;
    if (!blocks.count(look->legend)) {
      legends.push_back(look->legend);
      order[look->legend] = look->order;
      blocks[look->legend].first = look->colour;
    }
    const double x0 = (std::max(e.ts_us, from) - from) / 1e3, x1 = (std::min(e.end_us(), to) - from) / 1e3;
    const double top = row_base + 0.9 - 0.27 * look->lane;
    blocks[look->legend].second << x0 << " " << x1 << " " << top - 0.24 << " " << top << "\n";
  }
  std::sort(legends.begin(), legends.end(), [&](const std::string& a, const std::string& b) { return order[a] < order[b]; });
  std::ostringstream data;
  for (const auto& l : legends) data << "# " << l << "\n" << blocks[l].second.str() << "\n\n";
  if (any_failure) data << "# failures\n" << failures.str() << "\n\n";
  std::ofstream(data_path) << data.str();

  std::ostringstream gp;
  gp << "set terminal pngcairo size 1400," << 160 + 70 * rows << " font 'sans,10'\n"
     << "set output '" << png << "'\n"
     << "set title \"Timeline: " << steps << " steps of the first worker from the middle of the run\"\n"
     << "set xlabel \"ms from " << std::fixed << std::setprecision(3) << (from - job_start) / 1e6 << std::defaultfloat << std::setprecision(6)
     << " s into the job (every process on the scheduler's clock; the job's first event is 0 s)\"\nset xrange [0:" << std::max(1e-3, (to - from) / 1e3) << "]\n"
     << "set yrange [-0.1:" << rows << "]\nset grid xtics\nset key outside right top\n"
     << "set style fill solid 1.0 noborder\nset ytics (";
  for (int p = 0; p < rows; ++p) gp << (p ? ", " : "") << "'" << t.processes[static_cast<size_t>(p)] << "' " << rows - 1 - p + 0.5;
  gp << ")\n";
  if (rows > 1) {
    for (int p = 1; p < rows; ++p) gp << "set arrow from graph 0, first " << p << " to graph 1, first " << p << " nohead lc rgb '#cccccc'\n";
  }
  gp << "plot ";
  int index = 0;
  for (const auto& l : legends) {
    gp << (index ? ", \\\n     " : "") << "'" << data_path << "' index " << index
       << " using (($1+$2)/2):(($3+$4)/2):(($2-$1)/2):(($4-$3)/2) with boxxyerror lc rgb '" << blocks[l].first
       << "' title '" << l << "'";
    ++index;
  }
  if (any_failure) {
    gp << (index ? ", \\\n     " : "") << "'" << data_path << "' index " << index
       << " using 1:2 with points pt 9 ps 2 lc rgb '#d00000' title 'failure, rejoin, recovery'";
    ++index;
  }
  if (index == 0) gp << "NaN notitle";
  gp << "\n";
  return gp.str();
}

Status DrawTimeline(const LoadedTrace& trace, const std::string& png, int steps) {
  const std::string base = png.substr(0, png.size() - (png.ends_with(".png") ? 4 : 0));
  const std::string script = base + ".gp";
  std::ofstream(script) << TimelineScript(trace, png, base + ".dat", steps);
  return RunCommand({"gnuplot", script}, 60).WithContext("drawing the timeline with gnuplot (scripts/setup.sh installs gnuplot-nox)");
}

}  // namespace gradsync
