// Decoded datasets that every process on a host shares: the first to load an IDX pair decodes it
// (gzip, checks) into a cache file, written atomically under a lock; every process maps that file
// read-only, checked by size and checksum, so N workers on a host hold one copy of the pixels in
// memory (the kernel's page cache), not N.
//
// The file (a checked file, common/base/atomic_file.h, magic "GSDATA1 ") is named after the
// dataset and a hash of its source files' paths, sizes and modification times: new source files
// get a new cache file. Its body: n, dim (8 bytes each), num_classes (4), 4 zero bytes, then the
// n labels and the n x dim pixels, one byte each, as the IDX files hold them.
#pragma once

#include <functional>
#include <string>

#include "common/base/status.h"
#include "common/data/dataset.h"

namespace gradsync {

// Where decoded datasets are kept unless told otherwise: $GRADSYNC_DATA_CACHE, else
// $XDG_CACHE_HOME/gradsync, else $HOME/.cache/gradsync, else /tmp/gradsync-cache-<uid>.
std::string DefaultDataCacheDir();

// LoadIdxDataset's dataset (stored as bytes), through a cache file in `cache_dir` (created, mode
// 0700, when missing). A cache file that fails its check (cut short, corrupted, another format) is
// rebuilt, with a warning; a cache directory that cannot be written, or a lock another process
// holds for over `lock_timeout_s`, is a warning and the dataset is loaded privately. Problems with
// the IDX files themselves are errors, as LoadIdxDataset's.
Result<Dataset> LoadIdxDatasetCached(const std::string& images_path, const std::string& labels_path, int num_classes,
                                     const std::string& name, const std::string& cache_dir,
                                     double lock_timeout_s = 120);

// The cache file LoadIdxDatasetCached uses for this pair in `cache_dir` (its name depends on the
// files' paths, sizes and modification times); kNotFound when a source file is missing.
Result<std::string> IdxCachePath(const std::string& images_path, const std::string& labels_path,
                                 const std::string& name, const std::string& cache_dir);

namespace internal {
// Tests only: `hook` runs in the process that is about to write a cache file, holding its lock,
// before it decodes the IDX files (a test counts the writers, and holds the lock long enough that
// a second loader without it would write too). Empty: nothing runs.
void SetCacheWriterHookForTesting(std::function<void()> hook);
}  // namespace internal

}  // namespace gradsync
