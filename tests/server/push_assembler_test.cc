#include "server/requests/shard_codecs.h"
#include "server/shard/push_assembler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gradsync {
namespace {

PsRequest Part(int part, int parts, std::vector<Segment> segments, int64_t clock = 5, int64_t version = 2) {
  PsRequest r;
  r.type = wire::PUSH;
  r.clock = clock;
  r.push.version = version;
  r.parts = parts;
  r.part = part;
  r.segments = std::move(segments);
  return r;
}

PushChunk Chunk(const PsRequest& r, float v) {
  std::vector<float> values(static_cast<size_t>(TotalSize(r.segments)), v);
  Frame none;
  std::vector<float> decoded;
  return TakeChunk(r.segments, {}, &none, values.data(), values.size(), &decoded);
}

TEST(PushAssemblerTest, ThePartsOfAPushCarryOneRate) {
  PushAssembler a;
  auto p0 = Part(0, 2, {{0, 4}}), p1 = Part(1, 2, {{4, 8}});
  p0.push.lr = 0.25f;
  ASSERT_TRUE(a.Check(1, p0, 0).ok());
  EXPECT_EQ(a.Add(1, p0, Chunk(p0, 1)), nullptr);
  EXPECT_EQ(a.Check(1, p1, 0).code(), StatusCode::kInvalidArgument);  // no rate where part 0 had one
  p1.push.lr = 0.5f;
  EXPECT_EQ(a.Check(1, p1, 0).code(), StatusCode::kInvalidArgument);
  p1.push.lr = 0.25f;
  ASSERT_TRUE(a.Check(1, p1, 0).ok());
  HeldPush* whole = a.Add(1, p1, Chunk(p1, 2));
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->lr, 0.25f);
  // Without a rate on any part: none (the job's schedule).
  a.Forget(1);
  const auto q0 = Part(0, 2, {{0, 4}}, 6), q1 = Part(1, 2, {{4, 8}}, 6);
  ASSERT_TRUE(a.Check(1, q0, 0).ok());
  a.Add(1, q0, Chunk(q0, 1));
  ASSERT_TRUE(a.Check(1, q1, 0).ok());
  EXPECT_TRUE(std::isnan(a.Add(1, q1, Chunk(q1, 1))->lr));
}

TEST(PushAssemblerTest, APushCountsWhenItsLastPartIsIn) {
  PushAssembler a;
  const auto p0 = Part(0, 3, {{0, 4}}), p1 = Part(1, 3, {{8, 12}}), p2 = Part(2, 3, {{4, 8}});
  ASSERT_TRUE(a.Check(1, p0, 0).ok());
  EXPECT_EQ(a.Add(1, p0, Chunk(p0, 1)), nullptr);
  ASSERT_TRUE(a.Check(1, p1, 0).ok());
  EXPECT_EQ(a.Add(1, p1, Chunk(p1, 2)), nullptr);
  ASSERT_TRUE(a.Check(1, p2, 0).ok());
  HeldPush* whole = a.Add(1, p2, Chunk(p2, 3));
  ASSERT_NE(whole, nullptr);
  ASSERT_EQ(whole->chunks.size(), 3u);
  EXPECT_EQ(whole->chunks[1].segments, p1.segments);
  EXPECT_EQ(whole->chunks[2].values()[3], 3.0f);  // copied: small values never point into a frame
  a.Forget(1);
  EXPECT_FALSE(a.Check(1, p1, 0).ok());  // forgotten: part 1 has no first part any more
}

// A push's table rows come in its last part, with keys (their ids) and no segments. Mutation
// caught: rows accepted in an earlier part, whose room under the bound other pushes could take
// before this push counts (a shard's CHECK would then fail).
TEST(PushAssemblerTest, TableRowsComeInAPushsLastPart) {
  PushAssembler a;
  PsRequest rows = Part(0, 2, {});
  rows.tables = {{0, 3}};
  EXPECT_EQ(a.Check(1, rows, 3).code(), StatusCode::kInvalidArgument);
  const auto p0 = Part(0, 2, {{0, 4}});
  ASSERT_TRUE(a.Check(1, p0, 0).ok());
  EXPECT_EQ(a.Add(1, p0, Chunk(p0, 1)), nullptr);
  rows.part = 1;
  ASSERT_TRUE(a.Check(1, rows, 3).ok());
  PsRequest keys = Part(1, 2, {});
  EXPECT_FALSE(a.Check(1, keys, 3).ok());  // keys without table runs: a sparse push, never in parts
}

TEST(PushAssemblerTest, PartsThatDoNotBelongAreRefused) {
  PushAssembler a;
  const auto p0 = Part(0, 3, {{0, 4}});
  EXPECT_EQ(a.Check(0, Part(1, 3, {{4, 8}}), 0).code(), StatusCode::kInvalidArgument);  // no first part
  ASSERT_TRUE(a.Check(0, p0, 0).ok());
  a.Add(0, p0, Chunk(p0, 1));
  EXPECT_FALSE(a.Check(0, Part(2, 3, {{4, 8}}), 0).ok());                // out of order
  EXPECT_FALSE(a.Check(0, Part(1, 3, {{4, 8}}, /*clock=*/6), 0).ok());   // another push's clock
  EXPECT_FALSE(a.Check(0, Part(1, 4, {{4, 8}}), 0).ok());                // another part count
  EXPECT_FALSE(a.Check(0, Part(1, 3, {{4, 8}}, 5, /*version=*/3), 0).ok());  // another version
  EXPECT_FALSE(a.Check(0, Part(1, 3, {{2, 6}}), 0).ok());                // repeats elements of part 0
  EXPECT_FALSE(a.Check(0, Part(1, 3, {{4, 8}}), /*num_keys=*/2).ok());   // keys
  PsRequest coded = Part(1, 3, {{4, 8}});
  coded.codec = "fp16";
  EXPECT_FALSE(a.Check(0, coded, 0).ok());
  EXPECT_TRUE(a.Check(0, Part(1, 3, {{4, 8}}), 0).ok());
  EXPECT_TRUE(a.Check(2, p0, 0).ok());  // workers are apart
}

TEST(PushAssemblerTest, TheRestOfAFailedPushIsDroppedQuietly) {
  PushAssembler a;
  a.Failed(1, Part(0, 3, {{0, 4}}));
  EXPECT_FALSE(a.IsRestOfFailed(1, Part(0, 3, {{0, 4}})));  // a new first part starts afresh
  EXPECT_TRUE(a.IsRestOfFailed(1, Part(1, 3, {{4, 8}})));
  EXPECT_TRUE(a.IsRestOfFailed(1, Part(2, 3, {{8, 12}})));
  EXPECT_FALSE(a.IsRestOfFailed(1, Part(1, 3, {{4, 8}}, /*clock=*/6)));
  EXPECT_FALSE(a.IsRestOfFailed(0, Part(1, 3, {{4, 8}})));
}

}  // namespace
}  // namespace gradsync
