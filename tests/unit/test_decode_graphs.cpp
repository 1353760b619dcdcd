// The context buckets of CUDA decode graphs (backend/decode_graphs.h): host arithmetic, checked
// on the CPU at every position of several caches. The graphs themselves are tested against the
// eager path in test_cuda_kernels.cpp (CudaStage.DecodeGraphsMatchEagerBitwise; needs a GPU).
#include <gtest/gtest.h>

#include <set>

#include "backend/decode_graphs.h"

namespace {

bool power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

TEST(DecodeGraphs, BucketIsTheSmallestPowerOfTwoThatHoldsTheCacheCappedAtItsCapacity) {
  for (int ctx : {1, 2, 50, 63, 64, 65, 100, 128, 129, 4096, 4100, 40000}) {
    std::set<int> buckets;
    int prev = 0;
    for (int pos = 0; pos < ctx; ++pos) {
      const int b = ppb::decode_context_bucket(pos, ctx);
      ASSERT_GE(b, pos + 1) << "ctx " << ctx << " pos " << pos;  // holds every key of the step
      ASSERT_LE(b, ctx) << "ctx " << ctx << " pos " << pos;      // never beyond the cache
      ASSERT_GE(b, prev) << "ctx " << ctx << " pos " << pos;     // a later step never shrinks
      if (b != ctx) {
        ASSERT_TRUE(power_of_two(b)) << b;
        ASSERT_GE(b, ppb::kMinDecodeBucket) << b;
      }
      // The smallest such bucket: the next one down (half, or the minimum) does not hold it.
      if (b > ppb::kMinDecodeBucket) {
        int below = ppb::kMinDecodeBucket;
        while (below * 2 < b) below *= 2;
        ASSERT_LT(below, pos + 1) << "ctx " << ctx << " pos " << pos << " bucket " << b;
      }
      prev = b;
      buckets.insert(b);
    }
    // At most log2(ctx / 64) + 1 buckets, plus the capped one: the graphs a group captures.
    int bound = 1;
    for (long v = ppb::kMinDecodeBucket; v < ctx; v *= 2) ++bound;
    EXPECT_LE(static_cast<int>(buckets.size()), bound) << "ctx " << ctx;
  }
  EXPECT_EQ(ppb::decode_context_bucket(0, 4096), 64);
  EXPECT_EQ(ppb::decode_context_bucket(63, 4096), 64);
  EXPECT_EQ(ppb::decode_context_bucket(64, 4096), 128);
  EXPECT_EQ(ppb::decode_context_bucket(4095, 4096), 4096);
  EXPECT_EQ(ppb::decode_context_bucket(4099, 4100), 4100);
  EXPECT_EQ(ppb::decode_context_bucket(10, 20), 20);
}

TEST(DecodeGraphs, PlanKeysCoverEveryPositionOfTheBucketWithinTheWindow) {
  const int ctx = 700;
  for (int window : {0, 1, 5, 64, 100, 4096}) {
    for (int pos = 0; pos < ctx; ++pos) {
      const int bucket = ppb::decode_context_bucket(pos, ctx);
      const int keys = ppb::decode_plan_keys(bucket, window);
      const int attended = window > 0 ? std::min(window, pos + 1) : pos + 1;
      ASSERT_GE(keys, attended) << "window " << window << " pos " << pos;
      ASSERT_LE(keys, bucket);
      if (window > 0) ASSERT_LE(keys, window);
    }
  }
}

}  // namespace
