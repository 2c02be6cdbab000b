#include "common/trace.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>

#include "common/atomic_file.h"

namespace gradsync {
namespace {

struct Event {
  const char* name;
  const char* category;
  const char* arg_name;
  const char* arg2_name;
  double ts_us;
  double dur_us;  // < 0: an instant event
  double arg;
  double arg2;
};

struct ThreadBuffer {
  int tid = 0;
  std::vector<Event> events;
};

struct Registry {
  std::mutex mu;  // guards `buffers` (registration, once per thread) and the process fields
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::string role;
  int rank = 0;
  double offset_us = 0;
  std::chrono::steady_clock::time_point start;
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
    buffer->events.reserve(1 << 14);
  }
  return *buffer;
}

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

}  // namespace

std::atomic<bool> Trace::on_{false};

void Trace::Start(const std::string& role, int rank, double clock_offset_us) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.role = role;
    r.rank = rank;
    r.offset_us = clock_offset_us;
    r.start = std::chrono::steady_clock::now();
    for (auto& b : r.buffers) b->events.clear();
  }
  on_.store(true, std::memory_order_release);
}

double Trace::NowUs() {
  const Registry& r = registry();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - r.start).count() + r.offset_us;
}

void Trace::Complete(const char* name, const char* category, double begin_us, double dur_us, const char* arg_name,
                     double arg, const char* arg2_name, double arg2) {
  Mine().events.push_back({name, category, arg_name, arg2_name, begin_us, dur_us, arg, arg2});
}

void Trace::Instant(const char* name, const char* category, const char* arg_name, double arg) {
  Mine().events.push_back({name, category, arg_name, nullptr, NowUs(), -1, arg, 0});
}

Status Trace::Stop(const std::string& path, size_t* events) {
  on_.store(false, std::memory_order_release);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int pid = r.rank;
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": ", pid);
  out += buf + Quoted(r.role + " " + std::to_string(r.rank)) + "}}";
  size_t n = 0;
  for (const auto& b : r.buffers) {
    for (const Event& e : b->events) {
      out += ",\n{\"name\": " + Quoted(e.name) + ", \"cat\": " + Quoted(e.category);
      if (e.dur_us < 0) {
        std::snprintf(buf, sizeof(buf), ", \"ph\": \"i\", \"s\": \"t\", \"ts\": %.3f, \"pid\": %d, \"tid\": %d", e.ts_us, pid, b->tid);
      } else {
        std::snprintf(buf, sizeof(buf), ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d", e.ts_us,
                      e.dur_us, pid, b->tid);
      }
      out += buf;
      if (e.arg_name != nullptr) {
        out += ", \"args\": {" + Quoted(e.arg_name);
        std::snprintf(buf, sizeof(buf), ": %.17g", e.arg);
        out += buf;
        if (e.arg2_name != nullptr) {
          out += ", " + Quoted(e.arg2_name);
          std::snprintf(buf, sizeof(buf), ": %.17g", e.arg2);
          out += buf;
        }
        out += "}";
      }
      out += "}";
      ++n;
    }
    b->events.clear();
  }
  out += "\n]}\n";
  if (events != nullptr) *events = n;
  return WriteFileAtomically(path, out);
}

}  // namespace gradsync
