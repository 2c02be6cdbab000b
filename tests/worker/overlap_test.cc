// The overlapped bucket reducer: buckets cut in readiness order (a small first one, large
// tensors split), each launched once every tensor in it is ready, each element reduced exactly
// once, and failures reported.
#include "worker/allreduce/overlap.h"

#include <gtest/gtest.h>

#include <mutex>

#include "models/model.h"

namespace gradsync {
namespace {

// Records the all-reduce calls; "averages" by adding 1 to every element so that a test can see
// each element was reduced exactly once.
class RecordingCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status AllReduce(FloatSpan data, ReduceOp) override {
    std::lock_guard lock(mu);
    calls.push_back(data.size());
    for (float& x : data) x += 1.0f;
    return fail_after >= 0 && static_cast<int>(calls.size()) > fail_after ? UnavailableError("peer gone") : OkStatus();
  }
  Status AllReduce16(std::span<uint16_t>, Float16) override { return OkStatus(); }
  Status ReduceScatter(FloatSpan, ReduceOp, std::span<const size_t>) override { return UnimplementedError("not recorded"); }
  Status AllGatherChunks(FloatSpan, std::span<const size_t>) override { return UnimplementedError("not recorded"); }
  Status Broadcast(FloatSpan, int) override { return OkStatus(); }
  Status AllGather(std::span<const std::byte>, std::vector<std::vector<std::byte>>*) override { return OkStatus(); }
  Status Barrier() override { return OkStatus(); }
  uint64_t bytes_sent() const override { return 0; }
  uint64_t bytes_received() const override { return 0; }

  std::mutex mu;
  std::vector<size_t> calls;
  int fail_after = -1;
};

std::vector<TensorInfo> Layout(const std::vector<int64_t>& sizes) {
  std::vector<TensorInfo> out;
  int64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back({"t" + std::to_string(i), {sizes[i]}, off, sizes[i], false});
    off += sizes[i];
  }
  return out;
}

TEST(OverlapTest, BucketsFollowReadinessOrderWithASmallFirstBucket) {
  RecordingCollective c;
  // Floats: 1000, 10, 5000, 20 (the last tensor is ready first). Bucket 4000 B = 1000 floats,
  // first bucket 400 B = 100 floats.
  const auto layout = Layout({1000, 10, 5000, 20});
  OverlappedReducer r(&c, layout, 4000, 400);
  ASSERT_EQ(r.num_buckets(), 7u);  // 100, then 5930 in buckets of at most 1000
  size_t covered = 0;
  size_t prev_begin = 6030;
  for (size_t i = 0; i < r.num_buckets(); ++i) {
    auto [b, e] = r.bucket(i);
    EXPECT_EQ(e, prev_begin) << "bucket " << i << " is not next below the previous one";
    EXPECT_LE(e - b, i == 0 ? 100u : 1000u);
    covered += e - b;
    prev_begin = b;
  }
  EXPECT_EQ(r.bucket(0), (std::pair<size_t, size_t>{5930, 6030}));  // all of t3 and the top of t2
  EXPECT_EQ(covered, 6030u);
  EXPECT_EQ(prev_begin, 0u);
}

TEST(OverlapTest, EachBucketGoesOnceItsTensorsAreReadyAndEveryElementOnce) {
  RecordingCollective c;
  const auto layout = Layout({300, 7, 900, 3});
  OverlappedReducer r(&c, layout, 1600, 64);
  std::vector<float> grads(1210, 0.0f);
  for (int step = 0; step < 3; ++step) {
    r.Begin(grads);
    r.OnReady(3);
    r.OnReady(2);
    r.OnReady(1);
    r.OnReady(0);
    ASSERT_TRUE(r.Finish().ok());
  }
  for (float g : grads) ASSERT_EQ(g, 3.0f);  // one reduction per element per step
  EXPECT_EQ(c.calls.size(), 3 * r.num_buckets());
  // A model that reports nothing still gets every bucket reduced at Finish.
  r.Begin(grads);
  ASSERT_TRUE(r.Finish().ok());
  for (float g : grads) ASSERT_EQ(g, 4.0f);
}

TEST(OverlapTest, AFailedBucketFailsTheStepWithoutHanging) {
  RecordingCollective c;
  c.fail_after = 1;
  const auto layout = Layout({500, 500});
  OverlappedReducer r(&c, layout, 400, 400);
  std::vector<float> grads(1000, 0.0f);
  r.Begin(grads);
  r.OnReady(1);
  r.OnReady(0);
  Status s = r.Finish();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("peer gone"), std::string::npos);
}

TEST(OverlapTest, TheMlpReportsEveryTensorLastLayerFirst) {
  ModelOptions mo;
  mo.name = "mlp";
  mo.input_dim = 6;
  mo.num_classes = 3;
  mo.hidden = {5, 4};
  auto m = std::move(CreateModel(mo)).value();
  m->Initialize(1);
  std::vector<size_t> order;
  m->set_grad_ready([&](size_t t) { order.push_back(t); });
  std::vector<float> x(12, 0.5f);
  std::vector<int32_t> y = {0, 2};
  Batch b;
  b.size = 2;
  b.dim = 6;
  b.x = x.data();
  b.labels = y;
  m->ForwardBackward(b);
  EXPECT_EQ(order, (std::vector<size_t>{4, 5, 2, 3, 0, 1}));
}

}  // namespace
}  // namespace gradsync
