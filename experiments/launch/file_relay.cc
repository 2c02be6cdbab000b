#include "experiments/launch/file_relay.h"

#include <algorithm>
#include <boost/archive/iterators/base64_from_binary.hpp>
#include <boost/archive/iterators/binary_from_base64.hpp>
#include <boost/archive/iterators/transform_width.hpp>
#include <cctype>
#include <filesystem>
#include <ostream>
#include <sstream>

#include "common/base/atomic_file.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;
namespace it = boost::archive::iterators;

constexpr size_t kChunk = 57;  // bytes per data line: 76 base64 characters

std::string Base64(std::string_view bytes) {
  // The encoder reads whole 3-byte groups: give it a padded copy, keep the characters the real
  // bytes make, and pad with '='.
  std::string padded(bytes);
  padded.append((3 - bytes.size() % 3) % 3, '\0');
  using Encoder = it::base64_from_binary<it::transform_width<std::string::const_iterator, 6, 8>>;
  std::string s(Encoder(padded.cbegin()), Encoder(padded.cend()));
  s.resize((bytes.size() * 8 + 5) / 6);
  s.append((4 - s.size() % 4) % 4, '=');
  return s;
}

// Decodes a chunk that EmitFiles wrote; false on a character outside the alphabet.
bool FromBase64(std::string_view text, std::string* out) {
  if (text.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  std::string chars(text.substr(0, text.size() - pad));
  for (char c : chars)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '/') return false;
  chars.append(pad, 'A');  // whole 4-character groups; the padding's bytes are dropped below
  using Decoder = it::transform_width<it::binary_from_base64<std::string::const_iterator>, 8, 6>;
  std::string bytes(Decoder(chars.cbegin()), Decoder(chars.cend()));
  bytes.resize(chars.size() / 4 * 3 - pad);
  out->append(bytes);
  return true;
}

// A path the collector may write: relative, plain names, no "..".
bool SafePath(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.size() > 512) return false;
  for (char c : p)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '/') return false;
  std::stringstream parts(p);
  for (std::string part; std::getline(parts, part, '/');)
    if (part.empty() || part == "." || part == "..") return false;
  return true;
}

// "  3: rest" (srun --label) -> "rest"; other lines as they are.
std::string_view Unlabelled(std::string_view line) {
  size_t i = line.find_first_not_of(' ');
  if (i == std::string_view::npos) return line;
  size_t j = i;
  while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j]))) ++j;
  if (j > i && line.substr(j, 2) == ": ") return line.substr(j + 2);
  return line;
}

}  // namespace

Status EmitFiles(const std::string& dir, int task, std::ostream& out) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (auto e = fs::recursive_directory_iterator(dir, ec); !ec && e != fs::recursive_directory_iterator(); e.increment(ec)) {
    if (e->is_regular_file()) files.push_back(e->path());
  }
  if (ec) return UnavailableError(dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  const std::string t = std::to_string(task);
  for (const auto& f : files) {
    ASSIGN_OR_RETURN(const std::string data, ReadWholeFile(f.string()));
    const std::string rel = fs::relative(f, dir).string();
    out << "#gradsync-file " << t << " " << data.size() << " " << rel << "\n";
    for (size_t i = 0; i < data.size(); i += kChunk) {
      out << "#gradsync-data " << t << " " << Base64(std::string_view(data).substr(i, kChunk)) << "\n";
    }
    out << "#gradsync-end " << t << " " << rel << "\n";
  }
  out.flush();
  return out ? OkStatus() : UnavailableError("cannot write the files of task " + t + " to the output");
}

bool FileCollector::Line(std::string_view raw) {
  const std::string_view line = Unlabelled(raw);
  if (!line.starts_with("#gradsync-")) return false;
  std::istringstream words{std::string(line)};
  std::string kind;
  int task = -1;
  words >> kind >> task;
  if (!words || task < 0) {
    errors_.push_back("a malformed line: " + std::string(line.substr(0, 80)));
    return true;
  }
  if (kind == "#gradsync-file") {
    Open o;
    words >> o.bytes >> o.path;
    if (!words || !SafePath(o.path)) {
      errors_.push_back("task " + std::to_string(task) + ": a file with a malformed size or path");
      return true;
    }
    if (auto prev = open_.find(task); prev != open_.end()) errors_.push_back(prev->second.path + " was cut short");
    open_[task] = std::move(o);
  } else if (kind == "#gradsync-data" || kind == "#gradsync-end") {
    auto o = open_.find(task);
    std::string rest;
    words >> rest;
    if (o == open_.end()) {
      errors_.push_back("task " + std::to_string(task) + ": " + kind.substr(10) + " outside a file");
    } else if (kind == "#gradsync-data") {
      if (!FromBase64(rest, &o->second.data) || o->second.data.size() > o->second.bytes) {
        errors_.push_back(o->second.path + ": malformed data");
        open_.erase(o);
      }
    } else {
      if (rest != o->second.path || o->second.data.size() != o->second.bytes) {
        errors_.push_back(o->second.path + ": " + std::to_string(o->second.data.size()) + " of " +
                          std::to_string(o->second.bytes) + " bytes arrived");
      } else {
        done_.emplace_back(o->second.path, std::move(o->second.data));
      }
      open_.erase(o);
    }
  } else {
    errors_.push_back("an unknown line: " + kind);
  }
  return true;
}

Status FileCollector::Finish() {
  for (const auto& [task, o] : open_) errors_.push_back(o.path + " (task " + std::to_string(task) + ") was cut short");
  open_.clear();
  for (const auto& [path, data] : done_) {
    const fs::path target = fs::path(dest_) / path;
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (Status s = WriteFileAtomically(target.string(), data); !s.ok()) errors_.push_back(s.message());
    else written_.push_back(path);
  }
  done_.clear();
  if (errors_.empty()) return OkStatus();
  std::string all;
  for (const auto& e : errors_) all += (all.empty() ? "" : "; ") + e;
  errors_.clear();
  return DataLossError("files from the job's tasks: " + all);
}

}  // namespace gradsync
