#include "compression/pull_delta.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/base/numeric/rng.h"

namespace gradsync {
namespace {

std::unique_ptr<Compressor> Codec(const std::string& spec) { return std::move(CreateCompressor(spec, 7)).value(); }

// The shard's mirror of a worker follows exactly what that worker holds, pull after pull, and
// the compression error is sent later (the worker converges to the parameters).
TEST(PullDeltaTest, TheWorkerHoldsWhatTheMirrorSaysAndCatchesUp) {
  const Segment range{100, 164};
  PullDeltaEncoder encoder(Codec("topk:0.25"), range);
  PullDeltaDecoder decoder(Codec("topk:0.25"));
  std::vector<float> params(64), worker(164, 0.0f);
  Rng rng(3);
  for (auto& v : params) v = static_cast<float>(rng.UniformDouble());
  std::vector<Segment> all = {range};
  std::vector<uint8_t> payload;
  // No mirror yet: the first pull is answered raw, and recorded.
  auto first = encoder.Encode(0, all, params, 0, &payload);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(*first);
  encoder.Record(0, all, params.data());
  std::copy(params.begin(), params.end(), worker.begin() + 100);
  // The parameters move; each pull sends a quarter of the delta.
  for (auto& v : params) v += 1.0f;
  double error_before = 0, error_after = 0;
  for (int64_t clock = 1; clock <= 8; ++clock) {
    auto sent = encoder.Encode(0, all, params, clock, &payload);
    ASSERT_TRUE(sent.ok()) << sent.status();
    ASSERT_TRUE(*sent);
    EXPECT_LT(payload.size(), 64 * sizeof(float));
    ASSERT_TRUE(decoder.AddTo(payload, all, clock, worker).ok());
    double err = 0;
    for (int i = 0; i < 64; ++i) err += std::fabs(params[i] - worker[100 + i]);
    if (clock == 1) error_before = err;
    error_after = err;
  }
  EXPECT_LT(error_after, 1e-5 * error_before + 1e-6);  // every element sent once in four pulls
  // A worker that left starts raw again.
  encoder.Forget(0);
  EXPECT_FALSE(*encoder.Encode(0, all, params, 9, &payload));
}

TEST(PullDeltaTest, APartialRecordIsNoMirrorAndABadPayloadIsAnError) {
  const Segment range{0, 8};
  PullDeltaEncoder encoder(Codec("fp16"), range);
  std::vector<float> half(4, 1.0f);
  std::vector<Segment> first_half = {{0, 4}};
  encoder.Record(1, first_half, half.data());
  std::vector<uint8_t> payload;
  std::vector<float> all_values(8, 2.0f);
  std::vector<Segment> all = {range};
  EXPECT_FALSE(*encoder.Encode(1, all, all_values, 1, &payload));  // half a mirror: raw
  PullDeltaDecoder decoder(Codec("fp16"));
  std::vector<float> target(8, 0.0f);
  std::vector<uint8_t> garbage = {1, 2, 3};
  EXPECT_EQ(decoder.AddTo(garbage, all, 1, target).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace gradsync
