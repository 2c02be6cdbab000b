#include "common/obs/trace.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

google::protobuf::Struct ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  google::protobuf::Struct out;
  auto st = google::protobuf::util::JsonStringToMessage(text.str(), &out);
  EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << text.str();
  return out;
}

TEST(TraceTest, OffRecordsNothingAndOnWritesChromeTraceEvents) {
  testing::TempDir dir;
  { TraceSpan s("ignored", "compute"); }  // off: nothing
  // Events are stamped between these two readings of the steady clock, plus the offset (5000 s:
  // far more than the test takes, so a stamp without it falls outside the window).
  constexpr double kOffsetUs = 5e9;
  const double before = Trace::NowUs();
  ASSERT_TRUE(Trace::Start(dir.File("t.json"), "worker", 3, kOffsetUs).ok());
  {
    TraceSpan outer("step", "compute", {{"step", 7}});
    {
      TraceSpan inner("bucket", "comm", {{"floats", 1024}});
      inner.Arg("bytes", 4096);
      inner.CountCpu();
      volatile double spin = 0;
      for (int i = 0; i < 2000000; ++i) spin = spin + i;  // some CPU for the span to count
    }
    TraceInstant("rejoin", "failure", {{"clock", 12}});
  }
  std::thread other([] { TraceSpan s("push", "comm"); });
  other.join();
  const double after = Trace::NowUs();
  size_t events = 0;
  ASSERT_TRUE(Trace::Stop(&events).ok());
  EXPECT_EQ(events, 4u);
  { TraceSpan s("after", "compute"); }  // stopped: nothing more
  const auto json = ReadJson(dir.File("t.json"));
  const auto& list = json.fields().at("traceEvents").list_value().values();
  ASSERT_EQ(list.size(), 5);  // the process name, then the events
  const auto& meta = list[0].struct_value().fields();
  EXPECT_EQ(meta.at("ph").string_value(), "M");
  EXPECT_EQ(meta.at("args").struct_value().fields().at("name").string_value(), "worker 3");
  std::map<std::string, const google::protobuf::Struct*> by_name;
  for (int i = 1; i < list.size(); ++i) by_name[list[i].struct_value().fields().at("name").string_value()] = &list[i].struct_value();
  ASSERT_EQ(by_name.size(), 4u);
  auto field = [&](const char* name, const char* key) { return by_name[name]->fields().at(key); };
  EXPECT_EQ(field("step", "ph").string_value(), "X");
  EXPECT_EQ(field("rejoin", "ph").string_value(), "i");
  EXPECT_EQ(field("step", "pid").number_value(), 3);
  EXPECT_EQ(field("step", "args").struct_value().fields().at("step").number_value(), 7);
  EXPECT_EQ(field("bucket", "args").struct_value().fields().at("floats").number_value(), 1024);
  EXPECT_EQ(field("bucket", "args").struct_value().fields().at("bytes").number_value(), 4096);
  // CountCpu: the thread's CPU time in the span, more than nothing and no more than the span took.
  const double cpu_us = field("bucket", "args").struct_value().fields().at("cpu_us").number_value();
  EXPECT_GT(cpu_us, 0);
  EXPECT_LE(cpu_us, field("bucket", "dur").number_value() + 20);  // the two clocks' granularity
  EXPECT_EQ(field("step", "args").struct_value().fields().count("cpu_us"), 0u);  // only where asked
  // The offset applies; the inner span lies inside the outer one; the other thread has its own track.
  const double outer_ts = field("step", "ts").number_value(), outer_end = outer_ts + field("step", "dur").number_value();
  EXPECT_GE(outer_ts, before + kOffsetUs);
  EXPECT_LE(outer_end, after + kOffsetUs);
  EXPECT_GE(field("bucket", "ts").number_value(), outer_ts);
  EXPECT_LE(field("bucket", "ts").number_value() + field("bucket", "dur").number_value(), outer_end);
  EXPECT_NE(field("push", "tid").number_value(), field("step", "tid").number_value());
}

TEST(TraceTest, AnUnwritableFileIsAnError) {
  const Status st = Trace::Start("/nonexistent-dir/t.json", "worker", 0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent-dir/t.json"), std::string::npos) << st;
  EXPECT_FALSE(Trace::on());
  EXPECT_TRUE(Trace::Stop().ok());  // nothing was started
}

// Buffers that fill up go to the writer while recording goes on; every event reaches the file.
TEST(TraceTest, FullBuffersAreWrittenWhileRecordingGoesOn) {
  testing::TempDir dir;
  constexpr double kOffsetUs = 5e9;  // as above: every stamp within [before, after] + the offset
  const double before = Trace::NowUs();
  ASSERT_TRUE(Trace::Start(dir.File("t.json"), "server", 1, kOffsetUs).ok());
  constexpr int kPerThread = 30000;  // several buffers each
  auto record = [] {
    for (int i = 0; i < kPerThread; ++i) TraceSpan s("apply", "compute", {{"i", static_cast<double>(i)}});
  };
  std::thread a(record), b(record);
  a.join();
  b.join();
  EXPECT_TRUE(std::filesystem::exists(dir.File("t.json.partial")));
  const double after = Trace::NowUs();
  size_t events = 0;
  ASSERT_TRUE(Trace::Stop(&events).ok());
  EXPECT_EQ(events, 2u * kPerThread);
  EXPECT_FALSE(std::filesystem::exists(dir.File("t.json.partial")));
  const auto json = ReadJson(dir.File("t.json"));
  const auto& list = json.fields().at("traceEvents").list_value().values();
  ASSERT_EQ(list.size(), 2 * kPerThread + 1);
  std::map<double, std::vector<double>> seen;  // tid -> the i args, in file order
  for (int k = 1; k < list.size(); ++k) {
    const auto& f = list[k].struct_value().fields();
    EXPECT_GE(f.at("ts").number_value(), before + kOffsetUs);
    EXPECT_LE(f.at("ts").number_value() + f.at("dur").number_value(), after + kOffsetUs);
    seen[f.at("tid").number_value()].push_back(f.at("args").struct_value().fields().at("i").number_value());
  }
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& [tid, is] : seen) {
    ASSERT_EQ(is.size(), static_cast<size_t>(kPerThread));
    for (int i = 0; i < kPerThread; ++i) ASSERT_EQ(is[static_cast<size_t>(i)], i) << "thread " << tid;  // in order, none lost
  }
}

}  // namespace
}  // namespace gradsync
