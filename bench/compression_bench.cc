// gradsync-bench-compression: encode + decode throughput of every codec, 1 thread, in GB/s of
// fp32 gradient (n * 4 bytes / (encode + decode time)), median of repeats, for 1M and 16M floats.
// Goal (the compression issue): >= 1 GB/s for fp16, int8, sign and random-k, >= 0.3 GB/s for
// top-k and qsgd, so that compressing costs less than the link time it saves at 1 Gbit/s.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/base/numeric/rng.h"
#include "common/config/flags.h"
#include "compression/compressor.h"

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-bench-compression", "Encode+decode throughput per codec.");
  flags.options().add_options()
      ("codecs", po::value<std::string>()->default_value("fp16,int8,qsgd:16,sign,topk:0.01,topk:0.001,randomk:0.01"), "specs")
      ("sizes", po::value<std::string>()->default_value("1048576,16777216"), "floats")
      ("repeats", po::value<int>()->default_value(7), "timed repeats (median)");
  auto vm = flags.ParseOrExit(argc, argv);
  auto sizes = ParseIntList(vm["sizes"].as<std::string>(), 1, int64_t{1} << 28);
  if (!sizes.ok()) flags.Fail("--sizes: " + sizes.status().message());
  const int repeats = vm["repeats"].as<int>();
  if (repeats < 1) flags.Fail("--repeats must be >= 1");
  std::vector<std::string> specs;
  {
    std::string all = vm["codecs"].as<std::string>(), item;
    for (size_t pos = 0; pos <= all.size();) {
      size_t comma = all.find(',', pos);
      if (comma == std::string::npos) comma = all.size();
      specs.push_back(all.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  std::printf("# gradsync-bench-compression: 1 thread, GB/s of fp32 input (1e9 B), median of %d\n", repeats);
  std::printf("%-14s %10s %10s %10s %10s %10s %8s\n", "codec", "floats", "encode", "decode", "enc+dec", "ratio", "goal");
  for (int64_t n : *sizes) {
    Rng rng(1);
    std::vector<float> x(static_cast<size_t>(n)), out(static_cast<size_t>(n));
    for (float& v : x) v = static_cast<float>(rng.Normal());
    for (const auto& spec : specs) {
      auto c = CreateCompressor(spec, 3);
      if (!c.ok() || !*c) flags.Fail("bad codec '" + spec + "'");
      std::vector<uint8_t> p;
      std::vector<double> enc, dec, both;
      for (int r = 0; r < repeats + 1; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        (*c)->Encode(x, static_cast<uint64_t>(r), &p);
        auto t1 = std::chrono::steady_clock::now();
        Status s = (*c)->Decode(p, x.size(), static_cast<uint64_t>(r), out);
        auto t2 = std::chrono::steady_clock::now();
        if (!s.ok()) flags.Fail(spec + ": " + s.message());
        if (r == 0) continue;  // warm-up
        const double bytes = static_cast<double>(n) * 4;
        enc.push_back(bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
        dec.push_back(bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9);
        both.push_back(bytes / std::chrono::duration<double>(t2 - t0).count() / 1e9);
      }
      auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
      const double goal = spec.rfind("topk", 0) == 0 || spec.rfind("qsgd", 0) == 0 ? 0.3 : 1.0;
      const double b = med(both);
      std::printf("%-14s %10lld %10.2f %10.2f %10.2f %9.1fx %8s\n", spec.c_str(), static_cast<long long>(n), med(enc),
                  med(dec), b, static_cast<double>(n) * 4 / static_cast<double>(p.size()), b >= goal ? "met" : "MISSED");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
