// gradsync-keygen DIR: writes a cluster's CURVE keys (common/net/security.h) for --auth-dir.
#include <iostream>

#include "common/config/flags.h"
#include "common/net/security.h"

namespace gradsync {
namespace {

int Main(int argc, char** argv) {
  FlagParser flags("gradsync-keygen",
                   "Writes a cluster's CURVE keys into DIR: server.key and client.key (0600), server.pub and "
                   "authorized_keys.\n"
                   "Give every process of the job --auth-dir=DIR (copy DIR to each machine over a channel you trust). "
                   "The scheduler and servers need all four files; a worker needs only server.pub and client.key.",
                   "gradsync-keygen DIR [--force]");
  flags.options().add_options()
      ("dir", po::value<std::string>(), "the key directory (or the first argument)")
      ("force", po::bool_switch(), "replace existing keys (every process must get the new ones)");
  flags.positional().add("dir", 1);
  auto vm = flags.ParseOrExit(argc, argv);
  if (!vm.count("dir")) flags.Fail("the key directory is required: gradsync-keygen DIR");
  const std::string dir = vm["dir"].as<std::string>();
  if (Status s = WriteClusterKeys(dir, vm["force"].as<bool>()); !s.ok()) {
    std::cerr << "gradsync-keygen: error: " << s.message() << std::endl;
    return 1;
  }
  std::cout << "gradsync-keygen: wrote " << dir << "/server.key, " << dir << "/server.pub, " << dir << "/client.key, "
            << dir << "/authorized_keys; start every process with --auth-dir=" << dir
            << " (workers need only server.pub and client.key)" << std::endl;
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) { return gradsync::Main(argc, argv); }
