// Reader for IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//
// Format (big-endian): bytes 0-1 zero, byte 2 the element type (0x08 = unsigned byte, the only
// one these datasets use), byte 3 the number of dimensions d; then d uint32 sizes; then the
// elements, row-major. Every problem (missing file, bad magic, wrong dimensions, truncated or
// trailing data, corrupt gzip, labels that do not match the images) comes back as a Status whose
// message starts with the file's path and names the problem.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/data/dataset.h"

namespace gradsync {

struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes
};

// Reads a whole IDX file of unsigned bytes; `expected_dims` (if > 0) is checked.
Result<IdxArray> ReadIdxFile(const std::string& path, int expected_dims = 0);

// Loads an images file (n x rows x cols) and a labels file (n) into a dense dataset stored as
// bytes, as the file holds them, each pixel standing for its value scaled to [0, 1]
// (UnitByteValues); labels must be < num_classes.
Result<Dataset> LoadIdxDataset(const std::string& images_path, const std::string& labels_path,
                               int num_classes, const std::string& name);

// What each byte of a pixel stands for: byte x (1 / 255), in floats.
std::array<float, 256> UnitByteValues();

enum class Split { kTrain, kTest };

// Loads Fashion-MNIST from `dir` (train-/t10k-{images-idx3,labels-idx1}-ubyte, with or without
// .gz); checks 60000 / 10000 images of 28 x 28. With a `cache_dir`, through a cache file there
// that every process on the host maps (LoadIdxDatasetCached).
Result<Dataset> LoadFashionMnist(const std::string& dir, Split split, const std::string& cache_dir = "");

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace gradsync
