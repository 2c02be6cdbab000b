#include "common/data/dataset_cache.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/atomic_file.h"
#include "common/base/numeric/rng.h"
#include "common/data/idx.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

using testing::TempDir;

constexpr int kN = 50, kRows = 6, kCols = 5;

// An IDX pair of kN images of kRows x kCols random pixels (every byte value likely) and labels < 10.
struct Files {
  std::string images, labels;
};

void WriteGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> Header(std::vector<uint32_t> dims) {
  std::vector<uint8_t> b = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) b.push_back(d >> 24), b.push_back(d >> 16), b.push_back(d >> 8), b.push_back(d);
  return b;
}

Files MakeFiles(const TempDir& dir, uint64_t seed = 1, uint32_t n = kN, const std::string& prefix = "") {
  Rng rng(seed);
  std::vector<uint8_t> images = Header({n, kRows, kCols}), labels = Header({n});
  for (uint32_t i = 0; i < n * kRows * kCols; ++i) images.push_back(static_cast<uint8_t>(rng.UniformInt(256)));
  for (uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  Files f{dir.File(prefix + "img.gz"), dir.File(prefix + "lab.gz")};
  WriteGz(f.images, images);
  WriteGz(f.labels, labels);
  return f;
}

// Every feature and label of `a` and `b` the same, bit for bit.
void ExpectSame(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.n, b.n);
  ASSERT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.labels, b.labels);
  for (int64_t i = 0; i < a.n * a.dim; ++i) {
    const float x = a.FeatureAt(i), y = b.FeatureAt(i);
    ASSERT_EQ(std::memcmp(&x, &y, sizeof x), 0) << "feature " << i << ": " << x << " vs " << y;
  }
}

// A fresh IDX pair and cache directory for each test.
class DatasetCacheTest : public ::testing::Test {
 protected:
  // The pair loaded without a cache: what every cached load must equal.
  Dataset Own() const {
    auto d = LoadIdxDataset(f.images, f.labels, 10, "tiny");
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? std::move(d).value() : Dataset{};
  }
  Result<Dataset> Cached(int classes = 10) const { return LoadIdxDatasetCached(f.images, f.labels, classes, "tiny", cache); }
  std::string Path() const { return *IdxCachePath(f.images, f.labels, "tiny", cache); }

  TempDir dir;
  const Files f = MakeFiles(dir);
  const std::string cache = dir.File("cache");
};

TEST_F(DatasetCacheTest, TheSecondLoadMapsTheFileTheFirstWrote) {
  const Dataset own = Own();
  auto first = Cached();
  ASSERT_TRUE(first.ok()) << first.status();
  auto path = IdxCachePath(f.images, f.labels, "tiny", cache);
  ASSERT_TRUE(path.ok()) << path.status();
  struct stat before {};
  ASSERT_EQ(::stat(path->c_str(), &before), 0) << *path << " was not written";
  auto second = Cached();
  ASSERT_TRUE(second.ok()) << second.status();
  struct stat after {};
  ASSERT_EQ(::stat(path->c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // not written again
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_TRUE(second->stored_as_bytes());
  EXPECT_EQ(second->name, "tiny");
  EXPECT_EQ(second->num_classes, 10);
  ExpectSame(own, *first);
  ExpectSame(own, *second);
  // The file holds a byte per label and pixel, and its header: one copy, 4x smaller than floats.
  EXPECT_EQ(static_cast<int64_t>(after.st_size), int64_t{kCheckedFileHeaderBytes} + 24 + kN + kN * kRows * kCols);
}

TEST_F(DatasetCacheTest, ACorruptedOrCutShortCacheFileIsWrittenAgain) {
  const Dataset own = Own();
  ASSERT_TRUE(Cached().ok());
  const std::string path = Path();
  const auto size = std::filesystem::file_size(path);
  {  // a pixel flipped
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(size - 3));
    io.put('\x7f');
  }
  auto flipped = Cached();
  ASSERT_TRUE(flipped.ok()) << flipped.status();
  ExpectSame(own, *flipped);
  std::filesystem::resize_file(path, size - 100);  // cut short
  auto cut = Cached();
  ASSERT_TRUE(cut.ok()) << cut.status();
  ExpectSame(own, *cut);
  EXPECT_EQ(std::filesystem::file_size(path), size);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a cache file";  // another kind of file
  auto other = Cached();
  ASSERT_TRUE(other.ok()) << other.status();
  ExpectSame(own, *other);
}

TEST_F(DatasetCacheTest, ACacheDirectoryThatCannotBeWrittenLoadsPrivately) {
  std::ofstream(dir.File("a-file")) << "x";
  const Dataset own = Own();
  auto d = LoadIdxDatasetCached(f.images, f.labels, 10, "tiny", dir.File("a-file") + "/cache");
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectSame(own, *d);
  // The IDX files' own problems are errors, as without a cache.
  auto missing = LoadIdxDatasetCached(dir.File("none.gz"), f.labels, 10, "tiny", cache);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.gz"), std::string::npos) << missing.status();
  auto classes = Cached(5);
  ASSERT_FALSE(classes.ok());
  EXPECT_NE(classes.status().message().find("outside [0, 5)"), std::string::npos) << classes.status();
}

TEST_F(DatasetCacheTest, ACacheFileMadeForOtherClassesIsNotUsed) {
  ASSERT_TRUE(Cached().ok());
  auto more = Cached(12);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->num_classes, 12);
}

TEST_F(DatasetCacheTest, ThreadsLoadingAtOnceWriteOneFileAndGetTheSameData) {
  const Dataset own = Own();
  // Each thread opens the lock file itself, so flock serializes them as it does processes
  // (TwoProcessesLoadingAtOnce... below: processes).
  std::vector<Result<Dataset>> got(6, InternalError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = Cached(); });
  }
  for (auto& t : threads) t.join();
  for (auto& d : got) {
    ASSERT_TRUE(d.ok()) << d.status();
    ExpectSame(own, *d);
  }
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache)) files += e.path().extension() == ".gsdata";
  EXPECT_EQ(files, 1);
}

// One mapping of a process's /proc/PID/smaps: the cache file's.
struct CacheMapping {
  bool found = false;
  std::string path;    // as the kernel names it ("... (deleted)" once replaced)
  uint64_t inode = 0;
  int64_t rss_kb = -1, pss_kb = -1, shared_clean_kb = -1;
};

CacheMapping ReadCacheMapping(pid_t pid) {
  CacheMapping m;
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    const bool field = colon != std::string::npos && line.find(' ') > colon;  // "Rss:   8 kB"
    if (!field) {  // a mapping's first line: range perms offset dev inode path
      inside = !m.found && line.find(".gsdata") != std::string::npos;
      if (inside) {
        m.found = true;
        char range[64], perms[8], offset[32], dev[16];
        unsigned long long inode = 0;
        int used = 0;
        if (std::sscanf(line.c_str(), "%63s %7s %31s %15s %llu %n", range, perms, offset, dev, &inode, &used) >= 5) {
          m.inode = inode;
          m.path = line.substr(static_cast<size_t>(used));
        }
      }
      continue;
    }
    if (!inside) continue;
    const std::string key = line.substr(0, colon);
    const int64_t kb = std::strtoll(line.c_str() + colon + 1, nullptr, 10);
    if (key == "Rss") m.rss_kb = kb;
    if (key == "Pss") m.pss_kb = kb;
    if (key == "Shared_Clean") m.shared_clean_kb = kb;
  }
  return m;
}

// Reads one line from `fd` within `timeout_s`; "" on timeout or end of file.
std::string ReadLine(int fd, double timeout_s) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (line.empty() || line.back() != '\n') {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
    char c;
    if (::read(fd, &c, 1) != 1) return "";
    line.push_back(c);
  }
  return line;
}

// Two processes (fork) released at the same moment load one IDX pair through the cache: exactly
// one of them writes the file, under the lock (the writer holds it 300 ms before decoding, so
// that a loader not kept out by the lock would write too), and both map that one file, sharing
// its pages (each process's /proc/PID/smaps: the mapping's pages are Shared_Clean, and its Pss
// is half its Rss).
TEST_F(DatasetCacheTest, TwoProcessesLoadingAtOnceWriteOneFileUnderTheLockAndShareItsPages) {
  constexpr uint32_t kImages = 4000;  // 117 kB of pixels: 30 pages
  const Files big = MakeFiles(dir, 3, kImages, "big-");
  auto reference = LoadIdxDataset(big.images, big.labels, 10, "big");
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE(reference->stored_as_bytes());
  uint64_t expect_sum = 0;
  for (uint8_t b : reference->bytes) expect_sum += b;
  int go[2], results[2], release[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(results), 0);
  ASSERT_EQ(::pipe(release), 0);
  struct Children {
    std::vector<pid_t> pids;
    ~Children() {  // whatever happened, none is left running
      for (pid_t p : pids) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
  } children;
  for (int c = 0; c < 2; ++c) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: wait for the start, load, read every pixel, report, then hold the mapping
      // until the parent has read its smaps. _exit: nothing of the parent's test runs here.
      ::close(go[1]);
      ::close(results[0]);
      ::close(release[1]);
      char byte;
      (void)::read(go[0], &byte, 1);  // end of file: the parent let both go
      bool wrote = false;
      internal::SetCacheWriterHookForTesting([&wrote] {
        wrote = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      });
      auto d = LoadIdxDatasetCached(big.images, big.labels, 10, "big", cache);
      uint64_t sum = 0;
      if (d.ok()) {
        for (uint8_t b : d->bytes) sum += b;
      }
      const std::string report = std::string(d.ok() ? "ok " : "error ") + (wrote ? "1 " : "0 ") + std::to_string(sum) +
                                 " " + std::to_string(d.ok() ? d->n : -1) + "\n";
      (void)::write(results[1], report.data(), report.size());
      (void)::read(release[0], &byte, 1);
      ::_exit(0);
    }
    children.pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(results[1]);
  ::close(release[0]);
  ::close(go[1]);  // both start now
  int writers = 0;
  for (int c = 0; c < 2; ++c) {
    const std::string report = ReadLine(results[0], 20);
    ASSERT_FALSE(report.empty()) << "a loading process did not report within 20 s";
    char status[8];
    int wrote = 0;
    unsigned long long sum = 0;
    long long n = 0;
    ASSERT_EQ(std::sscanf(report.c_str(), "%7s %d %llu %lld", status, &wrote, &sum, &n), 4) << report;
    EXPECT_STREQ(status, "ok") << report;
    EXPECT_EQ(sum, expect_sum) << "a process read other pixels";
    EXPECT_EQ(n, kImages);
    writers += wrote;
  }
  ::close(results[0]);
  EXPECT_EQ(writers, 1) << "processes that wrote the cache file (the lock lets one write)";
  const std::string path = *IdxCachePath(big.images, big.labels, "big", cache);
  struct stat on_disk {};
  ASSERT_EQ(::stat(path.c_str(), &on_disk), 0) << path;
  std::vector<CacheMapping> maps;
  for (pid_t p : children.pids) maps.push_back(ReadCacheMapping(p));
  ::close(release[1]);  // the children may go
  for (const CacheMapping& m : maps) {
    std::printf("cache file mapped: Rss %lld kB, Pss %lld kB, Shared_Clean %lld kB, inode %llu\n",
                static_cast<long long>(m.rss_kb), static_cast<long long>(m.pss_kb),
                static_cast<long long>(m.shared_clean_kb), static_cast<unsigned long long>(m.inode));
  }
  for (size_t c = 0; c < maps.size(); ++c) {
    SCOPED_TRACE("process " + std::to_string(c));
    const CacheMapping& m = maps[c];
    ASSERT_TRUE(m.found) << "no mapping of a .gsdata file in /proc/" << children.pids[c] << "/smaps";
    EXPECT_EQ(m.path, path) << "it maps another file than the one on disk (replaced by a second writer?)";
    EXPECT_EQ(m.inode, static_cast<uint64_t>(on_disk.st_ino));
    // Every page read by both: each is mapped twice, so shared, and each process is charged half.
    EXPECT_GE(m.rss_kb, int64_t{kImages} * kRows * kCols / 1024) << "the pixels were read";
    EXPECT_EQ(m.shared_clean_kb, m.rss_kb) << "pages of the mapping not shared with the other process";
    EXPECT_LE(m.pss_kb, m.rss_kb / 2 + 4) << "Pss " << m.pss_kb << " kB of Rss " << m.rss_kb << " kB";
  }
}

TEST_F(DatasetCacheTest, NewSourceFilesGetANewCacheFile) {
  auto a = Cached();
  ASSERT_TRUE(a.ok());
  const std::string old_path = Path();
  MakeFiles(dir, 2);  // other pixels, the same paths
  std::filesystem::last_write_time(f.images, std::filesystem::last_write_time(f.images) + std::chrono::seconds(5));
  auto b = Cached();
  ASSERT_TRUE(b.ok());
  EXPECT_NE(Path(), old_path);
  const Dataset own = Own();
  ExpectSame(own, *b);
  bool differs = false;
  for (int64_t i = 0; i < a->n * a->dim && !differs; ++i) differs = a->FeatureAt(i) != b->FeatureAt(i);
  EXPECT_TRUE(differs);
  ExpectSame(*a, *a);  // the old mapping still reads
}

// What a model gets from a dataset stored as bytes is, bit for bit, what it got when the loader
// turned every pixel into a float (scaled, then standardized, in two passes) and batches copied
// those floats.
TEST_F(DatasetCacheTest, BatchesOfBytesAreTheFloatsTheyStoodFor) {
  auto bytes = Cached();
  ASSERT_TRUE(bytes.ok());
  Dataset floats = *bytes;  // as the loader used to make it
  floats.features.resize(static_cast<size_t>(floats.n * floats.dim));
  for (size_t i = 0; i < floats.features.size(); ++i) floats.features[i] = bytes->bytes[i] * (1.0f / 255.0f);
  floats.bytes = {};
  floats.bytes_owner = nullptr;
  Standardize(&*bytes, 0.2860f, 0.3530f);
  Standardize(&floats, 0.2860f, 0.3530f);
  BatchBuffer from_bytes, from_floats;
  const std::vector<uint32_t> rows = {7, 0, 49, 7, 23};
  const Batch a = from_bytes.Gather(*bytes, rows), b = from_floats.Gather(floats, rows);
  ASSERT_EQ(a.size, b.size);
  EXPECT_EQ(std::memcmp(a.x, b.x, sizeof(float) * static_cast<size_t>(a.size * a.dim)), 0);
  EXPECT_TRUE(std::equal(a.labels.begin(), a.labels.end(), b.labels.begin()));
  const Batch c = from_bytes.Slice(*bytes, 10, 30), d = SliceBatch(floats, 10, 30);
  ASSERT_EQ(c.size, 20);
  EXPECT_EQ(std::memcmp(c.x, d.x, sizeof(float) * static_cast<size_t>(c.size * c.dim)), 0);
  EXPECT_TRUE(std::equal(c.labels.begin(), c.labels.end(), d.labels.begin()));
}

}  // namespace
}  // namespace gradsync
