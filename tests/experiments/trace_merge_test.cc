#include "experiments/trace/trace_merge.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/obs/trace.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(TraceMergeTest, MergesProcessesInOrderOnOneClockWithTheirCorrections) {
  testing::TempDir dir;
  // A server's file as Trace writes it, with the correction its refined offset recorded.
  Write(dir.File("server-0.json"), R"({"traceEvents": [
{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "server 0"}},
{"name": "apply", "cat": "server", "ph": "X", "ts": 1000.5, "dur": 20, "pid": 0, "tid": 1, "args": {"worker": 1, "clock": 7}},
{"ph": "M", "name": "clock_correction", "pid": 0, "tid": 0, "args": {"us": -100}}
]})");
  // A worker's, written by Trace itself.
  ASSERT_TRUE(Trace::Start(dir.File("worker-1.json"), "worker", 1, /*clock_offset_us=*/0).ok());
  Trace::Complete("push", "comm", 800, 10, {{"shard", 0}, {"clock", 7}});
  Trace::Instant("step failed", "failure");
  Trace::RefineClockOffset(50);  // every event of this file moves 50 us later in the merge
  ASSERT_TRUE(Trace::Stop().ok());

  auto stats = MergeTraces({dir.File("scheduler.json"), dir.File("server-0.json"), dir.File("worker-1.json")},
                           dir.File("trace.json"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->processes, 2);
  EXPECT_EQ(stats->events, 3u);
  ASSERT_EQ(stats->missing, std::vector<std::string>{dir.File("scheduler.json")});

  auto t = LoadTrace(dir.File("trace.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->processes, (std::vector<std::string>{"server 0", "worker 1"}));
  std::map<std::string, TraceEvent> by_name;
  for (const auto& e : t->events) by_name[e.name] = e;
  // Time starts at the first event (the push at 800 + 50); the apply: 1000.5 - 100.
  EXPECT_DOUBLE_EQ(by_name["push"].ts_us, 0);
  EXPECT_DOUBLE_EQ(by_name["apply"].ts_us, 1000.5 - 100 - 850);
  EXPECT_DOUBLE_EQ(by_name["apply"].dur_us, 20);
  EXPECT_EQ(by_name["apply"].process, 0);
  EXPECT_EQ(by_name["push"].process, 1);
  EXPECT_EQ(by_name["apply"].Arg("worker"), 1);
  EXPECT_EQ(by_name["push"].Arg("clock"), 7);
  EXPECT_EQ(by_name["push"].Arg("missing", -5), -5);
  EXPECT_TRUE(by_name["step failed"].instant);
  EXPECT_EQ(by_name["step failed"].category, "failure");
}

TEST(TraceMergeTest, ABrokenFileIsAnErrorNamingIt) {
  testing::TempDir dir;
  Write(dir.File("a.json"), "{\"traceEvents\": [ {\"name\": \"x\"");  // cut short (a killed process's .partial)
  auto stats = MergeTraces({dir.File("a.json")}, dir.File("trace.json"));
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find(dir.File("a.json")), std::string::npos) << stats.status();
  Write(dir.File("b.json"), "{\"traceEvents\": [\n{\"name\": \"x\", \"ph\": \"X\", \"ts\": \"soon\", \"pid\": 0}\n]}\n");
  auto b = LoadTrace(dir.File("b.json"));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("no valid ts"), std::string::npos) << b.status();
  Write(dir.File("c.json"), R"({"events": []})");
  EXPECT_FALSE(LoadTrace(dir.File("c.json")).ok());
  // Cut short after an event (no closing line), and a line that is no object: named by line.
  Write(dir.File("d.json"), "{\"traceEvents\": [\n{\"name\": \"push\", \"ph\": \"X\", \"ts\": 1, \"dur\": 2, \"pid\": 0}\n");
  auto d = LoadTrace(dir.File("d.json"));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("cut short"), std::string::npos) << d.status();
  Write(dir.File("e.json"), "{\"traceEvents\": [\n{\"name\": \"push\", \"ph\": \"X\", \"ts\": 1, \"dur\": 2, \"pid\": 0},\n{\"name\" 3}\n]}\n");
  auto e = LoadTrace(dir.File("e.json"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find(dir.File("e.json") + ":3:"), std::string::npos) << e.status();
  EXPECT_EQ(LoadTrace(dir.File("missing.json")).status().code(), StatusCode::kNotFound);
}

TEST(TraceMergeTest, NamesWithEscapesReadBackAsWritten) {
  testing::TempDir dir;
  ASSERT_TRUE(Trace::Start(dir.File("t.json"), "worker \"q\" \\", 2).ok());
  Trace::Complete("a \"quoted\" \\ name\t", "user", 5, 1);
  ASSERT_TRUE(Trace::Stop().ok());
  auto t = LoadTrace(dir.File("t.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->processes, std::vector<std::string>{"worker \"q\" \\ 2"});
  ASSERT_EQ(t->events.size(), 1u);
  EXPECT_EQ(t->events[0].name, "a \"quoted\" \\ name\t");
}

TEST(TraceMergeTest, TheTimelineScriptHasARowPerProcessAndTheSpansOfTheWindow) {
  LoadedTrace t;
  t.processes = {"scheduler 0", "server 0", "worker 0"};
  auto span = [&](const char* name, int process, double ts, double dur, double step = -1) {
    TraceEvent e;
    e.name = name;
    e.process = process;
    e.ts_us = ts;
    e.dur_us = dur;
    if (step >= 0) e.args["step"] = step;
    t.events.push_back(e);
  };
  for (int s = 0; s < 10; ++s) {
    span("begin step", 2, 1000.0 * s, 100, s);
    span("forward", 2, 1000.0 * s + 100, 400);
    span("finish step", 2, 1000.0 * s + 500, 400, s);
    span("apply", 1, 1000.0 * s + 700, 100);
  }
  testing::TempDir dir;
  const std::string script = TimelineScript(t, dir.File("t.png"), dir.File("t.dat"), 2);
  for (const char* row : {"'scheduler 0' 2.5", "'server 0' 1.5", "'worker 0' 0.5"}) {
    EXPECT_NE(script.find(row), std::string::npos) << row << "\n" << script;
  }
  // Steps 4 and 5 (the middle two of ten): 2 ms.
  EXPECT_NE(script.find("set xrange [0:1.9]"), std::string::npos) << script;
  // Where 0 ms is: 4 ms after the job's first event, on the scheduler's clock.
  EXPECT_NE(script.find("set xlabel \"ms from 0.004 s into the job (every process on the scheduler's clock"), std::string::npos) << script;
  std::ifstream data(dir.File("t.dat"));
  std::string text((std::istreambuf_iterator<char>(data)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("# forward"), std::string::npos);
  EXPECT_NE(text.find("# apply"), std::string::npos);
  EXPECT_EQ(text.find("begin step"), std::string::npos);  // enclosing spans are not drawn
}

// Every kind of span in the legend has a colour of its own (validate and "forward waiting" were
// two near-identical greys, pull and optimizer the same green).
TEST(TraceMergeTest, EveryLegendEntryOfTheTimelineHasItsOwnColour) {
  LoadedTrace t;
  t.processes = {"server 0", "worker 0"};
  const std::vector<std::pair<const char*, int>> kinds = {
      {"forward + backward", 1}, {"forward", 1}, {"backward", 1}, {"wait for parameters", 1}, {"straggler delay", 1},
      {"optimizer", 1},         {"apply", 0},   {"checkpoint", 0}, {"push", 1},               {"encode", 1},
      {"answer pull", 0},       {"validate", 0}, {"pull", 1},      {"pull held", 0},          {"round wait", 0},
      {"recovery", 0}};
  double ts = 0;
  for (const auto& [name, process] : kinds) {
    TraceEvent e;
    e.name = name;
    e.process = process;
    e.ts_us = ts;
    e.dur_us = 50;
    ts += 100;
    t.events.push_back(e);
  }
  testing::TempDir dir;
  const std::string script = TimelineScript(t, dir.File("t.png"), dir.File("t.dat"), 2);
  std::set<std::string> colours;
  size_t entries = 0;
  for (size_t at = script.find("lc rgb '"); at != std::string::npos; at = script.find("lc rgb '", at + 1)) {
    if (script.compare(at, 15, "lc rgb '#cccccc") == 0) continue;  // the rows' separators
    colours.insert(script.substr(at + 8, 7));
    ++entries;
  }
  EXPECT_EQ(entries, 16u) << script;
  EXPECT_EQ(colours.size(), entries) << script;
}

}  // namespace
}  // namespace gradsync
