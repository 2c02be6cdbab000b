// --auth-dir across processes: a worker whose keys are not the cluster's hears that it was refused
// (not that the scheduler went silent), the scheduler logs the refused key's fingerprint, key files
// and directories others could read or replace are refused, and a worker needs neither server.key
// nor authorized_keys.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/net/security.h"
#include "experiments/process/process.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTinyJob = {"--dataset=blobs", "--hidden=16", "--epochs=1", "--max-steps=20",
                                           "--batch=16", "--log-every=10"};

std::string Keygen(const TempDir& dir, const std::string& name) {
  const std::string keys = dir.File(name);
  EXPECT_EQ(RunProcess({BinaryPath("gradsync-keygen"), keys}, 30).exit_code, 0);
  return keys;
}

// A worker's directory: the servers' public key and the workers' pair, nothing else.
std::string WorkerDir(const TempDir& dir, const std::string& name, const std::string& pub_from,
                      const std::string& client_from) {
  const std::string d = dir.File(name);
  fs::create_directories(d);
  fs::permissions(d, fs::perms::owner_all);
  fs::copy_file(pub_from + "/server.pub", d + "/server.pub");
  fs::copy_file(client_from + "/client.key", d + "/client.key");
  fs::permissions(d + "/client.key", fs::perms::owner_read | fs::perms::owner_write);
  return d;
}

std::string PublicKey(const std::string& file) {
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);)
    if (line.rfind("public ", 0) == 0) return line.substr(7);
  return "";
}

TEST(AuthBinaryTest, AWorkerWithTheWrongKeysIsToldSoAndTheSchedulerLogsTheKey) {
  TempDir dir;
  const std::string ours = Keygen(dir, "ours"), theirs = Keygen(dir, "theirs");
  const std::string port_file = dir.File("port");
  // The scheduler waits for registrations longer than both workers may take (on a loaded machine
  // too: one that had given up would leave the second worker nobody to refuse it), and is
  // stopped once they are done.
  ProcessGroup group;
  ASSERT_TRUE(group
                  .Spawn({"scheduler",
                          {BinaryPath("gradsync-server"), "--role=scheduler", "--num-servers=1", "--num-workers=1",
                           "--port-file=" + port_file, "--register-timeout=120", "--auth-dir=" + ours},
                          dir.File("scheduler.log")})
                  .ok());
  const std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  // A heartbeat timeout far beyond the run's limit: the worker cannot end by "lost the scheduler".
  const std::vector<std::string> worker = {BinaryPath("gradsync-worker"), "--mode=bsp", "--dataset=blobs",
                                           "--scheduler=127.0.0.1:" + port, "--heartbeat-timeout=120"};
  // The servers' public key right, the client key another cluster's: the scheduler refuses it.
  auto args = worker;
  args.push_back("--auth-dir=" + WorkerDir(dir, "wrong-client", ours, theirs));
  ProcessResult refused = RunProcess(args, 20);
  EXPECT_FALSE(refused.timed_out);
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("gradsync-worker: error: authentication failed with the scheduler at 127.0.0.1:" + port +
                             ": it refused this process's key (wrong --auth-dir?)\n"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("lost the scheduler"), std::string::npos) << refused.err;
  // Another cluster's keys altogether: the scheduler cannot even read the hello.
  args = worker;
  args.push_back("--auth-dir=" + WorkerDir(dir, "other-cluster", theirs, theirs));
  ProcessResult foreign = RunProcess(args, 20);
  EXPECT_FALSE(foreign.timed_out);
  EXPECT_EQ(foreign.exit_code, 1) << foreign.err;
  EXPECT_NE(foreign.err.find("gradsync-worker: error: authentication failed with the scheduler at 127.0.0.1:" + port +
                             ": it closed every handshake (it does not hold the server key this process's "
                             "server.pub names: another cluster's keys? wrong --auth-dir?)\n"),
            std::string::npos)
      << foreign.err;
  ASSERT_TRUE(group.Signal("scheduler", SIGTERM).ok());
  (void)group.WaitFor("scheduler", 20);
  ProcessResult sched;
  sched.err = ReadFile(dir.File("scheduler.log"));
  const std::string fingerprint = KeyFingerprint(PublicKey(theirs + "/client.key"));
  ASSERT_EQ(fingerprint.size(), 8u);
  EXPECT_NE(sched.err.find("authentication failed: refused a CURVE connection from 127.0.0.1 with client key " +
                           fingerprint + "...: not in this cluster's authorized_keys"),
            std::string::npos)
      << sched.err;
}

TEST(AuthBinaryTest, KeysOthersCanReadOrReplaceAreRefusedWithExitCode2) {
  TempDir dir;
  const std::string keys = Keygen(dir, "keys");
  const std::vector<std::string> worker = {BinaryPath("gradsync-worker"), "--mode=bsp", "--dataset=blobs",
                                           "--scheduler=127.0.0.1:1", "--auth-dir=" + keys};
  const std::vector<std::string> server = {BinaryPath("gradsync-server"), "--role=server", "--mode=bsp",
                                           "--scheduler=127.0.0.1:1", "--auth-dir=" + keys};
  const auto secret = fs::perms::owner_read | fs::perms::owner_write;
  struct Case {
    std::string file;
    fs::perms perms;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"client.key", secret | fs::perms::group_read | fs::perms::others_read,
       keys + "/client.key: permissions 0644 are too open: a secret key must be readable by its owner only (chmod 600 " +
           keys + "/client.key)"},
      {"client.key", secret | fs::perms::group_read | fs::perms::group_write | fs::perms::others_read | fs::perms::others_write,
       keys + "/client.key: permissions 0666 are too open"},
      {"", fs::perms::all, keys + ": permissions 0777 let group or others replace its keys (chmod go-w " + keys + ")"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    const std::string path = c.file.empty() ? keys : keys + "/" + c.file;
    const fs::perms before = fs::status(path).permissions();
    fs::permissions(path, c.perms);
    for (const auto& argv : {worker, server}) {
      ProcessResult r = RunProcess(argv, 20);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // one line
    }
    fs::permissions(path, before);
  }
  // server.key matters to the servers only: a worker never reads it.
  fs::permissions(keys + "/server.key", fs::perms::all);
  ProcessResult s = RunProcess(server, 20);
  EXPECT_EQ(s.exit_code, 2) << s.err;
  EXPECT_NE(s.err.find(keys + "/server.key: permissions 0777 are too open"), std::string::npos) << s.err;
}

TEST(AuthBinaryTest, AWorkerWithoutTheServersSecretKeyTrains) {
  TempDir dir;
  const std::string keys = Keygen(dir, "keys");
  const std::string mine = WorkerDir(dir, "worker-keys", keys, keys);
  EXPECT_FALSE(fs::exists(mine + "/server.key"));
  const std::string port_file = dir.File("port");
  ProcessResult sched, server;
  std::thread ts([&] {
    sched = RunProcess({BinaryPath("gradsync-server"), "--role=scheduler", "--num-servers=1", "--num-workers=1",
                        "--port-file=" + port_file, "--register-timeout=60", "--auth-dir=" + keys},
                       90);
  });
  const std::string port = ReadPortFile(port_file);
  ASSERT_FALSE(port.empty());
  std::thread tv([&] {
    server = RunProcess({BinaryPath("gradsync-server"), "--role=server", "--mode=bsp", "--scheduler=127.0.0.1:" + port,
                         "--auth-dir=" + keys},
                        90);
  });
  std::vector<std::string> args = {BinaryPath("gradsync-worker"), "--mode=bsp", "--scheduler=127.0.0.1:" + port,
                                   "--auth-dir=" + mine};
  args.insert(args.end(), kTinyJob.begin(), kTinyJob.end());
  ProcessResult w = RunProcess(args, 90);
  ts.join();
  tv.join();
  EXPECT_EQ(w.exit_code, 0) << w.out << w.err;
  EXPECT_EQ(sched.exit_code, 0) << sched.err;
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_NE(sched.err.find("scheduler: the shards accept messages of up to"), std::string::npos) << sched.err;
}

}  // namespace
}  // namespace gradsync::testing
