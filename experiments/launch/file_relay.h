// Files carried back through a launcher's output stream, for cluster runs whose nodes share no
// filesystem: each task prints the files it wrote as text lines (base64), `srun --label`
// gathers every task's lines into one stream, and the collector writes the files again.
//
//   #gradsync-file TASK BYTES PATH     a file starts (PATH relative, no "..")
//   #gradsync-data TASK BASE64         up to 57 bytes of it
//   #gradsync-end TASK PATH            it is complete
//
// Lines from several tasks may interleave (each carries its task); any other line is left
// alone (it is the job's output).
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace gradsync {

// Prints every regular file under `dir` (recursively, sorted by path) as above.
Status EmitFiles(const std::string& dir, int task, std::ostream& out);

class FileCollector {
 public:
  explicit FileCollector(std::string dest_dir) : dest_(std::move(dest_dir)) {}
  // Takes one line of the stream (a "N: " label from srun --label first is skipped). Returns
  // false when the line is not the relay's (the caller keeps it as output).
  bool Line(std::string_view line);
  // Writes the complete files under dest_dir. Fails naming a file that was cut short, whose size
  // does not match, or whose path or encoding is malformed; the good files are written anyway.
  Status Finish();
  const std::vector<std::string>& written() const { return written_; }

 private:
  struct Open {
    std::string path;
    size_t bytes = 0;
    std::string data;
  };
  std::string dest_;
  std::map<int, Open> open_;  // by task
  std::vector<std::pair<std::string, std::string>> done_;  // path, contents
  std::vector<std::string> errors_;
  std::vector<std::string> written_;
};

}  // namespace gradsync
