// fuzz_spec: the experiment spec parser (experiments/spec/spec.h), on arbitrary text.
//
// ParseExperiment is the text-level entry point LoadExperiment uses after reading the file.
// What must hold: no crash, no hang, no unbounded allocation; an error names the spec ("path:"
// first); an accepted spec has at least one run, each with a valid name and worker flags that
// are flags.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "experiments/spec/spec.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_spec: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string path = "fuzz.textproto";
  auto e = gradsync::ParseExperiment(text, path);
  if (!e.ok()) {
    if (e.status().message().rfind(path, 0) != 0) Fail("an error that does not name the spec: " + e.status().message());
    return 0;
  }
  if (e->runs.empty()) Fail("an accepted spec without runs");
  for (const auto& r : e->runs) {
    if (r.name.empty() || r.workers < 1 || r.workers > 64) Fail("an accepted run with a bad name or worker count");
    for (const auto& a : r.worker_args) {
      if (a.rfind("--", 0) != 0) Fail("a worker argument that is not a flag: " + a);
    }
  }
  return 0;
}
