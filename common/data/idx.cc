#include "common/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <cstring>
#include <filesystem>

#include "common/data/dataset_cache.h"

namespace gradsync {
namespace {

// Reads exactly `n` bytes unless the stream ends; returns bytes read or -1 on a gzip error.
int64_t ReadSome(gzFile f, uint8_t* out, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, 1 << 30));
    int r = gzread(f, out + got, chunk);
    if (r < 0) return -1;
    if (r == 0) break;
    got += r;
  }
  return got;
}

std::string GzError(gzFile f) {
  int err = 0;
  const char* msg = gzerror(f, &err);
  return err == Z_ERRNO ? std::strerror(errno) : std::string(msg ? msg : "unknown error");
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

}  // namespace

Result<IdxArray> ReadIdxFile(const std::string& path, int expected_dims) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return NotFoundError(path + ": no such file");
  }
  gzFile raw = gzopen(path.c_str(), "rb");
  if (raw == nullptr) return NotFoundError(path + ": cannot open: " + std::strerror(errno));
  std::unique_ptr<gzFile_s, GzCloser> f(raw);
  gzbuffer(raw, 1 << 17);

  uint8_t magic[4];
  int64_t got = ReadSome(raw, magic, 4);
  if (got < 0) return DataLossError(path + ": corrupt gzip stream: " + GzError(raw));
  if (got < 4) return DataLossError(path + ": truncated: file ends inside the 4-byte IDX magic");
  if (magic[0] != 0 || magic[1] != 0) {
    return DataLossError(path + ": bad IDX magic: first two bytes must be 0 (not an IDX file?)");
  }
  if (magic[2] != 0x08) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%02x", magic[2]);
    return DataLossError(path + ": unsupported IDX element type " + buf +
                         " (only 0x08, unsigned byte)");
  }
  const int ndims = magic[3];
  if (ndims < 1 || ndims > 4) {
    return DataLossError(path + ": bad IDX magic: " + std::to_string(ndims) + " dimensions");
  }
  if (expected_dims > 0 && ndims != expected_dims) {
    return InvalidArgumentError(path + ": expected " + std::to_string(expected_dims) +
                                " dimensions, the file has " + std::to_string(ndims));
  }
  IdxArray out;
  uint64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    uint8_t b[4];
    got = ReadSome(raw, b, 4);
    if (got < 0) return DataLossError(path + ": corrupt gzip stream: " + GzError(raw));
    if (got < 4) return DataLossError(path + ": truncated: file ends inside the dimension sizes");
    uint32_t d = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    if (d == 0) return DataLossError(path + ": dimension " + std::to_string(i) + " is 0");
    out.dims.push_back(d);
    total *= d;
    if (total > (uint64_t{1} << 34)) {
      return DataLossError(path + ": dimensions too large (" + std::to_string(total) + "+ bytes)");
    }
  }
  out.data.resize(total);
  got = ReadSome(raw, out.data.data(), static_cast<int64_t>(total));
  if (got < 0) return DataLossError(path + ": corrupt gzip stream: " + GzError(raw));
  if (static_cast<uint64_t>(got) < total) {
    return DataLossError(path + ": truncated: header promises " + std::to_string(total) +
                         " bytes of data, the file has " + std::to_string(got));
  }
  uint8_t extra;
  got = ReadSome(raw, &extra, 1);
  if (got < 0) return DataLossError(path + ": corrupt gzip stream: " + GzError(raw));
  if (got > 0) {
    return DataLossError(path + ": trailing bytes after the " + std::to_string(total) +
                         " bytes the header promises");
  }
  return out;
}

Result<Dataset> LoadIdxDataset(const std::string& images_path, const std::string& labels_path,
                               int num_classes, const std::string& name) {
  ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path, 3));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path, 1));
  if (images.dims[0] != labels.dims[0]) {
    return InvalidArgumentError(labels_path + ": has " + std::to_string(labels.dims[0]) +
                                " labels but " + images_path + " has " +
                                std::to_string(images.dims[0]) + " images");
  }
  Dataset d;
  d.name = name;
  d.n = images.dims[0];
  d.dim = int64_t{images.dims[1]} * images.dims[2];
  d.num_classes = num_classes;
  d.labels.resize(static_cast<size_t>(d.n));
  for (int64_t i = 0; i < d.n; ++i) {
    if (labels.data[i] >= num_classes) {
      return DataLossError(labels_path + ": label " + std::to_string(labels.data[i]) +
                           " at index " + std::to_string(i) + " is outside [0, " +
                           std::to_string(num_classes) + ")");
    }
    d.labels[i] = labels.data[i];
  }
  auto pixels = std::make_shared<const std::vector<uint8_t>>(std::move(images.data));
  d.bytes = *pixels;
  d.bytes_owner = std::move(pixels);
  d.byte_values = UnitByteValues();
  return d;
}

std::array<float, 256> UnitByteValues() {
  constexpr float kScale = 1.0f / 255.0f;
  std::array<float, 256> values{};
  for (int b = 0; b < 256; ++b) values[static_cast<size_t>(b)] = static_cast<uint8_t>(b) * kScale;
  return values;
}

Result<Dataset> LoadFashionMnist(const std::string& dir, Split split, const std::string& cache_dir) {
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  const int64_t expected = split == Split::kTrain ? 60000 : 10000;
  auto find = [&](const std::string& stem) -> Result<std::string> {
    for (const char* suffix : {"", ".gz"}) {
      std::string p = dir + "/" + stem + suffix;
      std::error_code ec;
      if (std::filesystem::exists(p, ec)) return p;
    }
    return NotFoundError(dir + "/" + stem + "[.gz]: not found (install the Debian package "
                         "dataset-fashion-mnist, or pass --data-dir)");
  };
  ASSIGN_OR_RETURN(std::string images, find(std::string(prefix) + "-images-idx3-ubyte"));
  ASSIGN_OR_RETURN(std::string labels, find(std::string(prefix) + "-labels-idx1-ubyte"));
  const std::string name = std::string("fashion-mnist-") + prefix;
  ASSIGN_OR_RETURN(Dataset d, cache_dir.empty() ? LoadIdxDataset(images, labels, 10, name)
                                                : LoadIdxDatasetCached(images, labels, 10, name, cache_dir));
  if (d.n != expected || d.dim != 28 * 28) {
    return InvalidArgumentError(images + ": expected " + std::to_string(expected) +
                                " images of 28 x 28, found " + std::to_string(d.n) + " of " +
                                std::to_string(d.dim) + " pixels");
  }
  return d;
}

}  // namespace gradsync
