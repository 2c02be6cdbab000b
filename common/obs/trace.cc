#include "common/obs/trace.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <sys/mman.h>

#include <vector>

#include "common/base/clock.h"

namespace gradsync {
namespace {

// A thread buffer: 2 MiB of events (about 20,000), aligned to and advised as one transparent
// huge page. The writer thread makes the next block and touches it before a recording thread
// needs it, so that no recording thread takes a page fault: measured, the faults of fresh blocks
// on the recording thread made half of the single-process runs 15% slower, and 4 KiB-page blocks
// made a 2-server 4-worker job 8% slower (bench/README.md, "Traces").
// Full buffers held before the writer starts writing them out.
constexpr size_t kHeldBuffers = 24;
// Fresh blocks the writer keeps ready.
constexpr size_t kSpares = 1;

struct Event {
  const char* name;
  const char* category;
  double ts_us;
  double dur_us;  // < 0: an instant event
  TraceArg args[kMaxTraceArgs];
  int num_args;
};

constexpr size_t kBufferBytes = size_t{2} << 20;

// A fixed array of events in one huge-page-sized allocation.
class EventBlock {
 public:
  static constexpr size_t kCapacity = kBufferBytes / sizeof(Event);
  EventBlock() : data_(static_cast<Event*>(std::aligned_alloc(kBufferBytes, kBufferBytes))) {
    if (data_ == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    (void)::madvise(data_, kBufferBytes, MADV_HUGEPAGE);  // a hint: without huge pages, 4 KiB ones
#endif
  }
  ~EventBlock() { std::free(data_); }
  EventBlock(const EventBlock&) = delete;
  EventBlock& operator=(const EventBlock&) = delete;

  bool full() const { return size_ == kCapacity; }
  size_t size() const { return size_; }
  void push_back(const Event& e) { data_[size_++] = e; }
  void clear() { size_ = 0; }
  // Faults every page in now (the writer thread does, for the recording threads).
  void Touch() { std::memset(static_cast<void*>(data_), 0, kBufferBytes); }
  const Event* begin() const { return data_; }
  const Event* end() const { return data_ + size_; }

 private:
  Event* data_;
  size_t size_ = 0;
};

// A thread's events: its buffer while it records, a full one while it waits for the writer.
struct ThreadBuffer {
  int tid = 0;
  std::unique_ptr<EventBlock> events;
};

// A JSON string literal of `s` (names here are identifiers, but a role could hold anything).
std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// TraceFile: the JSON file a trace is written into: where it goes, the process it names (pid),
// the clock offset added to every stamp written, the events written and the first failed
// write's errno, and the names' literals made so far. It belongs to the writer thread while that
// runs, and to Start and Stop (under the registry's mutex) otherwise.
struct TraceFile {
  std::FILE* file = nullptr;
  std::string path;
  int pid = 0;
  std::atomic<double> offset_us{0};
  size_t written = 0;
  int write_errno = 0;  // the first failed write's
  std::unordered_map<const char*, std::string> literals;  // the writer's (see Write)

  // Records a failed write's errno unless one is recorded already.
  void Failed() {
    if (write_errno == 0) write_errno = errno ? errno : EIO;
  }

  // Appends `events` of thread `tid` to the file (called with `mu` released: the file belongs
  // to the writer thread until Stop joined it).
  void Write(int tid, const EventBlock& events) {
    std::string out;
    out.reserve(events.size() * 160);
    const double offset = offset_us.load(std::memory_order_relaxed);
    char num[64];
    auto number = [&](double v) {  // the shortest text that reads back as v
      auto [end, ec] = std::to_chars(num, num + sizeof(num), v);
      out.append(num, ec == std::errc() ? end : num);
    };
    auto integer = [&](int v) {
      auto [end, ec] = std::to_chars(num, num + sizeof(num), v);
      out.append(num, ec == std::errc() ? end : num);
    };
    for (const Event& e : events) {
      out += ",\n{\"name\": ";
      out += Literal(e.name);
      out += ", \"cat\": ";
      out += Literal(e.category);
      out += e.dur_us < 0 ? ", \"ph\": \"i\", \"s\": \"t\", \"ts\": " : ", \"ph\": \"X\", \"ts\": ";
      // Microseconds to the nanosecond, as the clock gives them.
      number(std::round((e.ts_us + offset) * 1e3) / 1e3);
      if (e.dur_us >= 0) {
        out += ", \"dur\": ";
        number(std::round(e.dur_us * 1e3) / 1e3);
      }
      out += ", \"pid\": ";
      integer(pid);
      out += ", \"tid\": ";
      integer(tid);
      for (int i = 0; i < e.num_args; ++i) {
        out += i == 0 ? ", \"args\": {" : ", ";
        out += Literal(e.args[i].name);
        out += ": ";
        if (std::isfinite(e.args[i].value)) {
          number(e.args[i].value);
        } else {
          out += "null";  // JSON has no NaN
        }
      }
      if (e.num_args > 0) out += "}";
      out += "}";
    }
    if (std::fwrite(out.data(), 1, out.size(), file) != out.size()) Failed();
    written += events.size();
  }

  // A name's JSON literal, made once per name (names are literals: the pointer identifies it).
  const std::string& Literal(const char* name) {
    auto [it, added] = literals.try_emplace(name);
    if (added) it->second = Quoted(name);
    return it->second;
  }
};

// Registry: the process's trace recording: every thread's buffer (registered once, never
// removed), the full ones waiting for the writer thread, the fresh blocks it keeps ready, the
// writer thread itself, the file it writes (TraceFile), and the refined clock offset that Stop
// writes beside the events.
struct Registry {
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;  // registered once per thread, never removed
  std::deque<ThreadBuffer> full;                         // waiting for the writer
  std::vector<std::unique_ptr<EventBlock>> spares;     // fresh blocks, their pages touched
  std::thread writer;
  bool stopping = false;
  TraceFile out;
  double refined_offset_us = 0;
  double offset_error_us = -1;

  void WriterLoop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      // Full buffers wait in memory (up to kHeldBuffers, 48 MiB) so that a run of usual
      // length writes nothing until it ends; past that, the writer writes while recording goes on.
      // A recording thread that took the spare block gets the next one made here: the page
      // faults of fresh memory (most of a span's cost otherwise) fall on this thread.
      cv.wait(lock, [&] { return stopping || full.size() > kHeldBuffers || spares.size() < kSpares; });
      if (!stopping && spares.size() < kSpares) {
        lock.unlock();
        auto block = std::make_unique<EventBlock>();
        block->Touch();
        lock.lock();
        spares.push_back(std::move(block));
        continue;
      }
      if (full.empty()) {
        if (stopping) return;
        continue;
      }
      ThreadBuffer b = std::move(full.front());
      full.pop_front();
      lock.unlock();
      out.Write(b.tid, *b.events);
      lock.lock();
    }
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: threads may outlive static destruction
  return *r;
}

ThreadBuffer& Mine() {
  thread_local ThreadBuffer* buffer = nullptr;
  if (buffer == nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(std::make_unique<ThreadBuffer>());
    buffer = r.buffers.back().get();
    buffer->tid = static_cast<int>(r.buffers.size());
    if (!r.spares.empty()) {  // a block whose pages are in already
      buffer->events = std::move(r.spares.back());
      r.spares.pop_back();
      r.cv.notify_one();
    } else {
      buffer->events = std::make_unique<EventBlock>();
    }
  }
  return *buffer;
}

void Append(Event e) {
  ThreadBuffer& b = Mine();
  b.events->push_back(e);
  if (!b.events->full()) return;
  // Full: the writer thread takes it; this thread goes on with a fresh one.
  Registry& r = registry();
  std::unique_ptr<EventBlock> fresh;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.full.push_back({b.tid, std::move(b.events)});
    if (!r.spares.empty()) {
      fresh = std::move(r.spares.back());
      r.spares.pop_back();
    }
  }
  r.cv.notify_one();
  b.events = fresh ? std::move(fresh) : std::make_unique<EventBlock>();
}

Event MakeEvent(const char* name, const char* category, double ts, double dur, std::initializer_list<TraceArg> args) {
  Event e{name, category, ts, dur, {}, 0};
  for (const TraceArg& a : args) {
    if (e.num_args == kMaxTraceArgs) break;
    e.args[e.num_args++] = a;
  }
  return e;
}

}  // namespace

std::atomic<bool> Trace::on_{false};

Status Trace::Start(const std::string& path, const std::string& role, int rank, double clock_offset_us) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.out.file != nullptr) return FailedPreconditionError("a trace is being recorded already (into " + r.out.path + ")");
  const std::string partial = path + ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "w");
  if (f == nullptr) return UnavailableError("cannot create the trace file " + partial + ": " + std::strerror(errno));
  r.out.file = f;
  r.out.path = path;
  r.out.pid = rank;
  r.out.offset_us.store(clock_offset_us);
  r.refined_offset_us = clock_offset_us;
  r.offset_error_us = -1;
  r.out.written = 0;
  r.out.write_errno = 0;
  r.stopping = false;
  r.full.clear();
  for (auto& b : r.buffers) b->events->clear();
  const std::string header = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " +
                             std::to_string(rank) + ", \"tid\": 0, \"args\": {\"name\": " +
                             Quoted(role + " " + std::to_string(rank)) + "}}";
  if (std::fwrite(header.data(), 1, header.size(), f) != header.size()) r.out.Failed();
  r.writer = std::thread([&r] { r.WriterLoop(); });
  on_.store(true, std::memory_order_release);
  return OkStatus();
}


std::string TraceJsonString(const std::string& s) { return Quoted(s); }

double TestClockSkewUs() {
  static const double skew = [] {
    const char* v = std::getenv("GRADSYNC_TEST_CLOCK_SKEW_US");
    return v == nullptr ? 0.0 : std::strtod(v, nullptr);
  }();
  return skew;
}

Status CheckTraceFile(const std::string& path) {
  const std::string partial = path + ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "w");
  if (f == nullptr) return UnavailableError("cannot create the trace file " + partial + ": " + std::strerror(errno));
  std::fclose(f);
  std::remove(partial.c_str());
  return OkStatus();
}

void Trace::RefineClockOffset(double us, double error_us) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.refined_offset_us = us;
  r.offset_error_us = error_us;
}

double Trace::NowUs() { return SteadyMicros(); }

void Trace::Complete(const char* name, const char* category, double begin_us, double dur_us,
                     std::initializer_list<TraceArg> args) {
  Append(MakeEvent(name, category, begin_us, dur_us, args));
}

void Trace::Complete(const char* name, const char* category, double begin_us, double dur_us, const TraceArg* args,
                     int num_args) {
  Event e{name, category, begin_us, dur_us, {}, std::min(num_args, kMaxTraceArgs)};
  std::copy(args, args + e.num_args, e.args);
  Append(e);
}

void Trace::Instant(const char* name, const char* category, std::initializer_list<TraceArg> args) {
  Append(MakeEvent(name, category, NowUs(), -1, args));
}

Status Trace::Stop(size_t* events) {
  on_.store(false, std::memory_order_release);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.out.file == nullptr) {
      if (events != nullptr) *events = 0;
      return OkStatus();
    }
    r.stopping = true;
  }
  r.cv.notify_one();
  r.writer.join();  // it drains every full buffer first
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& b : r.buffers) {
    r.out.Write(b->tid, *b->events);
    b->events->clear();
  }
  const double correction = r.refined_offset_us - r.out.offset_us.load();
  if (correction != 0 || r.offset_error_us >= 0) {
    // us: what the merge adds to the written stamps; offset_us: the whole offset from this
    // process's clock to the scheduler's (Start's plus us); error_us: its bound.
    char meta[240];
    std::snprintf(meta, sizeof(meta),
                  ",\n{\"ph\": \"M\", \"name\": \"clock_correction\", \"pid\": %d, \"tid\": 0, \"args\": {\"us\": %.3f, \"error_us\": %.3f, "
                  "\"offset_us\": %.3f}}",
                  r.out.pid, correction, r.offset_error_us, r.refined_offset_us);
    if (std::fputs(meta, r.out.file) < 0) r.out.Failed();
  }
  static const char kFooter[] = "\n]}\n";
  if (std::fwrite(kFooter, 1, sizeof(kFooter) - 1, r.out.file) != sizeof(kFooter) - 1) r.out.Failed();
  if (std::fclose(r.out.file) != 0) r.out.Failed();
  r.out.file = nullptr;
  if (events != nullptr) *events = r.out.written;
  const std::string partial = r.out.path + ".partial";
  if (r.out.write_errno != 0) {
    std::remove(partial.c_str());
    return UnavailableError("the trace file " + r.out.path + " was not written: " + std::strerror(r.out.write_errno));
  }
  if (std::rename(partial.c_str(), r.out.path.c_str()) != 0) {
    return UnavailableError("the trace file " + r.out.path + " was not written: " + std::strerror(errno));
  }
  return OkStatus();
}

}  // namespace gradsync
