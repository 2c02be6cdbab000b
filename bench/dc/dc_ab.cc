// A/B of DelayCompensation::Correct: an earlier commit's (namespace gradsync_old, extracted by
// bench/delay_compensation_ab.sh) against this checkout's, on one shard of N floats, one worker,
// constant and adaptive lambda, alternated in rounds; median microseconds per push of each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "old.h"
#include "server/shard/transform/delay_compensation.h"

template <class DC, class Options>
double MedianUs(bool adaptive, int64_t n, int reps) {
  const gradsync::Segment range{0, n};
  Options o;
  o.lambda = 2;
  o.adaptive = adaptive;
  DC dc(o, range, 1);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 0.01f);
  std::vector<float> pulled(n), now(n), g(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    pulled[i] = d(rng);
    now[i] = pulled[i] + d(rng) * 0.1f;
    g[i] = d(rng);
  }
  const std::vector<gradsync::Segment> all = {range};
  dc.Pulled(0, all, pulled);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    dc.Correct(0, all, g.data(), now, out.data());
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 227461;  // the CNN's larger shard
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  for (bool adaptive : {false, true}) {
    std::vector<double> old_us, new_us;
    for (int r = 0; r < rounds; ++r) {
      old_us.push_back(MedianUs<gradsync_old::DelayCompensation, gradsync_old::DelayCompensationOptions>(adaptive, n, 200));
      new_us.push_back(MedianUs<gradsync::DelayCompensation, gradsync::DelayCompensationOptions>(adaptive, n, 200));
    }
    std::sort(old_us.begin(), old_us.end());
    std::sort(new_us.begin(), new_us.end());
    const double a = old_us[old_us.size() / 2], b = new_us[new_us.size() / 2];
    std::printf("%-9s %lld floats: old %.1f us, new %.1f us a push (medians of %d rounds), new/old %.2f\n",
                adaptive ? "adaptive" : "constant", static_cast<long long>(n), a, b, rounds, b / a);
  }
}
