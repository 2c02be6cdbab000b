#include "common/data/dataset_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/atomic_file.h"
#include "common/base/rng.h"
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

Files MakeFiles(const TempDir& dir, uint64_t seed = 1) {
  Rng rng(seed);
  std::vector<uint8_t> images = Header({kN, kRows, kCols}), labels = Header({kN});
  for (int i = 0; i < kN * kRows * kCols; ++i) images.push_back(static_cast<uint8_t>(rng.UniformInt(256)));
  for (int i = 0; i < kN; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  Files f{dir.File("img.gz"), dir.File("lab.gz")};
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

TEST_F(DatasetCacheTest, ProcessesLoadingAtOnceWriteOneFileAndGetTheSameData) {
  const Dataset own = Own();
  // Each thread opens the lock file itself, so flock serializes them as it does processes.
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
