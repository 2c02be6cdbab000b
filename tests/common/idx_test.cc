#include "common/data/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync {
namespace {

using testing::ReadFile;
using testing::TempDir;

std::vector<uint8_t> Idx(std::vector<uint32_t> dims, uint8_t type = 0x08) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  uint64_t total = 1;
  for (uint32_t d : dims) {
    b.push_back(d >> 24), b.push_back(d >> 16), b.push_back(d >> 8), b.push_back(d);
    total *= d;
  }
  for (uint64_t i = 0; i < total; ++i) b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

void WritePlain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void WriteGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

// Expects an error whose message starts with the path and contains `problem`.
void ExpectError(const Status& s, const std::string& path, const std::string& problem) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind(path, 0), 0u) << s;
  EXPECT_NE(s.message().find(problem), std::string::npos) << s;
}

TEST(IdxTest, ReadsPlainAndGzip) {
  TempDir dir;
  WritePlain(dir.File("a.idx"), Idx({3, 2, 2}));
  WriteGz(dir.File("a.idx.gz"), Idx({3, 2, 2}));
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    auto r = ReadIdxFile(dir.File(name), 3);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->dims, (std::vector<uint32_t>{3, 2, 2}));
    ASSERT_EQ(r->data.size(), 12u);
    EXPECT_EQ(r->data[11], 1);
  }
}

TEST(IdxTest, LoadsADatasetScaledToUnitRange) {
  TempDir dir;
  std::vector<uint8_t> images = Idx({2, 2, 2});
  images[4 + 12 + 0] = 255;
  WriteGz(dir.File("img.gz"), images);
  WriteGz(dir.File("lab.gz"), Idx({2}));
  auto d = LoadIdxDataset(dir.File("img.gz"), dir.File("lab.gz"), 10, "tiny");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->n, 2);
  EXPECT_EQ(d->dim, 4);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{0, 1}));
  EXPECT_FLOAT_EQ(d->FeatureAt(0), 1.0f);
  EXPECT_FLOAT_EQ(d->FeatureAt(1), 1.0f / 255.0f);
}

TEST(IdxTest, RejectsBrokenFiles) {
  TempDir dir;
  const std::string p = dir.File("bad");
  ExpectError(ReadIdxFile(dir.File("missing")).status(), dir.File("missing"), "no such file");

  WritePlain(p, {0, 0});
  ExpectError(ReadIdxFile(p).status(), p, "truncated");

  auto bytes = Idx({4, 3});
  bytes[0] = 0x1f;
  WritePlain(p, bytes);
  ExpectError(ReadIdxFile(p).status(), p, "bad IDX magic");

  WritePlain(p, Idx({4, 3}, 0x0D));
  ExpectError(ReadIdxFile(p).status(), p, "unsupported IDX element type 0x0d");

  WritePlain(p, Idx({4, 3}));
  ExpectError(ReadIdxFile(p, 3).status(), p, "expected 3 dimensions");

  bytes = Idx({4, 3});
  bytes.resize(bytes.size() - 5);
  WriteGz(p, bytes);
  ExpectError(ReadIdxFile(p).status(), p, "truncated: header promises 12 bytes of data, the file has 7");

  bytes = Idx({4, 3});
  bytes.push_back(9);
  WritePlain(p, bytes);
  ExpectError(ReadIdxFile(p).status(), p, "trailing bytes");

  bytes = Idx({4, 0});
  WritePlain(p, bytes);
  ExpectError(ReadIdxFile(p).status(), p, "dimension 1 is 0");
}

TEST(IdxTest, RejectsCorruptGzip) {
  TempDir dir;
  const std::string p = dir.File("c.gz");
  std::vector<uint8_t> big = Idx({1000, 10, 10});
  WriteGz(p, big);
  std::string raw = ReadFile(p);
  // Flip bytes in the middle of the deflate stream (and so break its CRC too).
  for (size_t i = raw.size() / 2; i < raw.size() / 2 + 16; ++i) raw[i] = static_cast<char>(~raw[i]);
  WritePlain(p, std::vector<uint8_t>(raw.begin(), raw.end()));
  auto r = ReadIdxFile(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message().rfind(p, 0), 0u) << r.status();
}

TEST(IdxTest, RejectsMismatchedLabels) {
  TempDir dir;
  WritePlain(dir.File("img"), Idx({3, 2, 2}));
  WritePlain(dir.File("lab"), Idx({2}));
  auto d = LoadIdxDataset(dir.File("img"), dir.File("lab"), 10, "x");
  ExpectError(d.status(), dir.File("lab"), "has 2 labels but");

  WritePlain(dir.File("lab"), Idx({3}));
  auto bad_range = LoadIdxDataset(dir.File("img"), dir.File("lab"), 2, "x");
  ExpectError(bad_range.status(), dir.File("lab"), "label 2 at index 2 is outside [0, 2)");

  auto wrong_kind = LoadIdxDataset(dir.File("lab"), dir.File("lab"), 10, "x");
  ExpectError(wrong_kind.status(), dir.File("lab"), "expected 3 dimensions");
}

TEST(IdxTest, FashionMnistDirectoryChecks) {
  TempDir dir;
  auto missing = LoadFashionMnist(dir.path(), Split::kTest);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("dataset-fashion-mnist"), std::string::npos);
  // Files of the wrong size are refused even when they are well-formed.
  WriteGz(dir.File("t10k-images-idx3-ubyte.gz"), Idx({5, 28, 28}));
  WriteGz(dir.File("t10k-labels-idx1-ubyte.gz"), Idx({5}));
  auto small = LoadFashionMnist(dir.path(), Split::kTest);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("expected 10000 images"), std::string::npos);
}

TEST(IdxTest, RealFashionMnistIfInstalled) {
  // Skipped only when the package's files are not there (a file that is there but cannot be
  // read is a failure), and never under CI=true.
  if (!std::filesystem::exists(std::string(kDefaultFashionMnistDir) + "/t10k-images-idx3-ubyte.gz")) {
    GRADSYNC_SKIP_UNLESS_CI("dataset-fashion-mnist is not installed (scripts/setup.sh installs it)");
  }
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->n, 10000);
  EXPECT_EQ(test->dim, 784);
  std::vector<int> counts(10, 0);
  for (int32_t y : test->labels) counts[y]++;
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test set is balanced
  double sum = 0;
  const int64_t pixels = test->n * test->dim;
  for (int64_t i = 0; i < pixels; ++i) {
    const float v = test->FeatureAt(i);
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / pixels, 0.2868, 0.002);  // the known test-set pixel mean
}

}  // namespace
}  // namespace gradsync
