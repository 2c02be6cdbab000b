// The simulator's codec times from a traced run (sim.codec_from): the encode per float of the
// workers' pushes, and the all-reduce workers' decode and sum of a gather codec's bucket per
// payload and float, which Codecs then charges instead of its own timing.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "experiments/sim/codec_costs.h"
#include "experiments/sim/inputs.h"
#include "tests/support/temp_dir.h"

namespace gradsync::sim {
namespace {

// Worker 0: three encodes (0.1, 0.2, 0.3 us per float); three decodes of all-gathered buckets,
// two inside their "all-reduce bucket" span without a `values` argument (traces written before
// it had one: 40 us / (2 payloads x 1000 floats) = 0.02, 60 / (2 x 1000) = 0.03) and one with
// it (20 / (4 x 500) = 0.01); a decode outside any bucket without values, and a compressed pull's
// decode (no payloads), which say nothing of a bucket.
const char* kTrace = R"({"traceEvents": [
{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "worker 0"}},
{"name": "all-reduce bucket", "cat": "comm", "ph": "X", "ts": 0, "dur": 500, "pid": 1, "tid": 1, "args": {"floats": 1000}},
{"name": "encode", "cat": "comm", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 1, "args": {"values": 1000, "bytes": 80}},
{"name": "decode", "cat": "comm", "ph": "X", "ts": 300, "dur": 40, "pid": 1, "tid": 1, "args": {"payloads": 2}},
{"name": "all-reduce bucket", "cat": "comm", "ph": "X", "ts": 1000, "dur": 500, "pid": 1, "tid": 1, "args": {"floats": 1000}},
{"name": "encode", "cat": "comm", "ph": "X", "ts": 1010, "dur": 200, "pid": 1, "tid": 1, "args": {"values": 1000, "bytes": 80}},
{"name": "decode", "cat": "comm", "ph": "X", "ts": 1300, "dur": 60, "pid": 1, "tid": 1, "args": {"payloads": 2}},
{"name": "encode", "cat": "comm", "ph": "X", "ts": 2010, "dur": 150, "pid": 1, "tid": 1, "args": {"values": 500, "bytes": 40}},
{"name": "decode", "cat": "comm", "ph": "X", "ts": 2300, "dur": 20, "pid": 1, "tid": 1, "args": {"payloads": 4, "values": 500}},
{"name": "decode", "cat": "comm", "ph": "X", "ts": 5000, "dur": 900, "pid": 1, "tid": 1, "args": {"payloads": 2}},
{"name": "decode", "cat": "comm", "ph": "X", "ts": 6000, "dur": 900, "pid": 1, "tid": 1, "args": {"bytes": 80}}
]})";

TEST(SimCodecTimesTest, EncodeAndGatherDecodeComeFromTheRunsSpans) {
  testing::TempDir dir;
  std::ofstream(dir.File("trace.json")) << kTrace;
  SimSettings s;
  ASSERT_TRUE(CodecTimesFromTrace(dir.File("trace.json"), &s).ok());
  EXPECT_DOUBLE_EQ(s.encode_us_per_float, 0.2);
  EXPECT_DOUBLE_EQ(s.gather_decode_us_per_float, 0.02);
  EXPECT_EQ(s.codec_source, dir.File("trace.json"));

  // The bucket's cost: every payload, its own too, at that rate.
  Codecs traced("topk:0.01", true, 0, s.encode_us_per_float, -1, s.gather_decode_us_per_float);
  EXPECT_DOUBLE_EQ(*traced.GatherDecodeUs(1000, 8, 0.25), 0.02 * 1000 * 8);
  auto encoded = traced.Cost(1000);
  ASSERT_TRUE(encoded.ok());
  EXPECT_DOUBLE_EQ(encoded->encode_us, 0.2 * 1000);
}

// A span that carries its thread's CPU time (`cpu_us`) counts that, not its wall time: the wall
// time also holds the time other processes had the core, which the simulator shares out itself.
TEST(SimCodecTimesTest, AnEncodesOwnCpuTimeCountsWhereTheSpanHasIt) {
  testing::TempDir dir;
  std::ofstream(dir.File("trace.json")) << R"({"traceEvents": [
{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "worker 0"}},
{"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "server 0"}},
{"name": "encode", "cat": "comm", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 1, "args": {"values": 1000, "bytes": 80, "cpu_us": 50}},
{"name": "encode", "cat": "server", "ph": "X", "ts": 10, "dur": 900, "pid": 2, "tid": 1, "args": {"values": 1000, "worker": 0, "cpu_us": 300}}
]})";
  SimSettings s;
  ASSERT_TRUE(CodecTimesFromTrace(dir.File("trace.json"), &s).ok());
  EXPECT_DOUBLE_EQ(s.encode_us_per_float, 0.05);
  EXPECT_DOUBLE_EQ(s.pull_encode_us_per_float, 0.3);
}

TEST(SimCodecTimesTest, WithoutDecodeSpansTheCodecIsTimedHere) {
  testing::TempDir dir;
  std::ofstream(dir.File("trace.json")) << R"({"traceEvents": [
{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "worker 0"}},
{"name": "encode", "cat": "comm", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 1, "args": {"values": 1000, "bytes": 80}}
]})";
  SimSettings s;
  ASSERT_TRUE(CodecTimesFromTrace(dir.File("trace.json"), &s).ok());
  EXPECT_DOUBLE_EQ(s.encode_us_per_float, 0.1);
  EXPECT_LT(s.gather_decode_us_per_float, 0);
  // Timed here: each other rank's payload decoded, then added in one pass at apply_ns_per_byte.
  Codecs timed("topk:0.01", true, 0, -1, -1, s.gather_decode_us_per_float);
  auto cost = timed.Cost(1000);
  ASSERT_TRUE(cost.ok());
  EXPECT_DOUBLE_EQ(*timed.GatherDecodeUs(1000, 8, 0.25), (cost->decode_us + 0.25 * 4 * 1000 / 1e3) * 7);
}

}  // namespace
}  // namespace gradsync::sim
