// Files that a crash cannot leave half-written: checkpoints, key files.
#pragma once

#include <string>

#include "common/status.h"

namespace gradsync {

// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename over `path`,
// fsync of the directory. After a crash `path` holds the old contents or the new, never a mix.
// The file has `mode` from its creation on (secret keys are never readable by others, not even
// for a moment).
Status WriteFileAtomically(const std::string& path, const std::string& bytes, unsigned mode = 0644);

// The whole file; kNotFound when it does not exist.
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace gradsync
