// gradsync-launch running a command as the workers: the job reaches the command as GRADSYNC_*
// variables (gradsync-worker itself, given none of the launcher's flags, joins the job through
// them), a failing or missing command stops the job with its name, and --dry-run shows each
// command with its environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/obs/process_summary.h"
#include "gradsync/config.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace gradsync::testing {
namespace {

// The launcher puts the build's python/ on a command's PYTHONPATH when the folder exists (a build
// with the Python package): the text without that word.
std::string WithoutPythonPath(std::string text) {
  for (size_t at; (at = text.find("PYTHONPATH=")) != std::string::npos;) {
    const size_t end = text.find(' ', at);
    text.erase(at, end == std::string::npos ? std::string::npos : end - at + 1);
  }
  return text;
}

namespace fs = std::filesystem;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The GRADSYNC_* variables of an `env` dump that this test process does not have itself.
std::map<std::string, std::string> JobVariables(const std::string& env_dump) {
  std::map<std::string, std::string> vars;
  for (const std::string& line : Lines(env_dump)) {
    const auto eq = line.find('=');
    if (line.rfind("GRADSYNC_", 0) != 0 || eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq);
    if (std::getenv(name.c_str()) == nullptr) vars[name] = line.substr(eq + 1);
  }
  return vars;
}

// No process whose command line names `dir` is left.
void ExpectNothingLeft(const std::string& dir) {
  ProcessResult ps = RunProcess({"/usr/bin/pgrep", "-f", "--", dir}, 10);
  EXPECT_EQ(ps.exit_code, 1) << ps.out;
}

const std::vector<std::string> kTinyJob = {"--dataset=blobs", "--hidden=8", "--epochs=1", "--max-steps=20",
                                           "--batch=16", "--log-every=10"};

// The command is `sh` (found on the PATH) running a script that writes its environment down and
// then becomes gradsync-worker with the model's flags only: mode, bound, scheduler, rank, output
// and keys come from the environment, and the job runs as with flags.
TEST(LaunchCommandTest, TheJobReachesTheCommandAsEnvironmentVariables) {
  TempDir dir;
  const std::string out = dir.File("out"), keys = dir.File("keys");
  ASSERT_EQ(RunProcess({BinaryPath("gradsync-keygen"), keys}, 30).exit_code, 0);
  std::ofstream(dir.File("worker.sh")) << "w=$1; shift\nenv > \"$GRADSYNC_OUT/env-$GRADSYNC_RANK.txt\"\nexec \"$w\" \"$@\"\n";
  std::vector<std::string> argv = {BinaryPath("gradsync-launch"), "--servers=1", "--workers=2", "--mode=ssp",
                                   "--staleness=1", "--heartbeat-timeout=5", "--auth-dir=" + keys, "--out=" + out,
                                   "sh", dir.File("worker.sh"), BinaryPath("gradsync-worker")};
  argv.insert(argv.end(), kTinyJob.begin(), kTinyJob.end());
  ProcessResult r = RunProcess(argv, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("job: ssp s=1, 1 server, 2 workers: 40 gradients applied"), std::string::npos) << r.out;
  const std::string port = ReadFile(out + "/logs/scheduler.port");
  ASSERT_FALSE(port.empty());
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(JobVariables(ReadFile(out + "/env-" + std::to_string(rank) + ".txt")),
              (std::map<std::string, std::string>{{"GRADSYNC_SCHEDULER", "127.0.0.1:" + Lines(port)[0]},
                                                  {"GRADSYNC_RANK", std::to_string(rank)},
                                                  {"GRADSYNC_OUT", out},
                                                  {"GRADSYNC_HEARTBEAT_TIMEOUT", "5"},
                                                  {"GRADSYNC_HOST", "127.0.0.1"},
                                                  {"GRADSYNC_MODE", "ssp"},
                                                  {"GRADSYNC_STALENESS", "1"},
                                                  {"GRADSYNC_AUTH_DIR", keys}}));
    auto summary = ReadProcessSummary(out + "/worker-" + std::to_string(rank) + ".json");
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->mode(), "ssp");
    EXPECT_EQ(summary->staleness_bound(), 1);
    EXPECT_EQ(summary->rank(), rank);
  }
  // commands.txt holds each worker's command with its environment, as a shell would run it.
  const std::vector<std::string> commands = Lines(ReadFile(out + "/commands.txt"));
  ASSERT_EQ(commands.size(), 4u);
  EXPECT_EQ(commands[2].rfind("GRADSYNC_SCHEDULER=127.0.0.1:" + Lines(port)[0] + " GRADSYNC_RANK=0 GRADSYNC_OUT=" + out, 0), 0u)
      << commands[2];
  EXPECT_NE(commands[3].find(" sh " + dir.File("worker.sh") + " " + BinaryPath("gradsync-worker") + " --dataset=blobs"),
            std::string::npos)
      << commands[3];
}

// gradsync-worker as the command itself, in all-reduce mode: the ring's listening address is in
// the environment too.
TEST(LaunchCommandTest, GradsyncWorkerAsTheCommandTrainsAnAllreduceJob) {
  TempDir dir;
  std::vector<std::string> argv = {BinaryPath("gradsync-launch"), "--mode=allreduce", "--workers=2", "--out=" + dir.path(),
                                   "--", BinaryPath("gradsync-worker")};
  argv.insert(argv.end(), kTinyJob.begin(), kTinyJob.end());
  ProcessResult r = RunProcess(argv, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("job: allreduce, 2 workers"), std::string::npos) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    auto summary = ReadProcessSummary(dir.File("worker-" + std::to_string(rank) + ".json"));
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->mode(), "allreduce");
    EXPECT_EQ(summary->steps(), 20);
  }
  EXPECT_NE(WithoutPythonPath(ReadFile(dir.File("commands.txt")))
                .find("GRADSYNC_BIND=127.0.0.1 GRADSYNC_MODE=allreduce " + BinaryPath("gradsync-worker")),
            std::string::npos);
}

TEST(LaunchCommandTest, ACommandThatFailsStopsTheJobAndNamesIt) {
  TempDir dir;
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--servers=1", "--workers=2", "--heartbeat-timeout=2",
                                "--out=" + dir.path(), "sh", "-c", "exit 3"},
                               60);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("job failed (worker command 'sh -c exit 3'; logs in " + dir.path() + "/logs): worker "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(" exited with code 3"), std::string::npos) << r.err;
  ExpectNothingLeft(dir.path());
}

TEST(LaunchCommandTest, ACommandThatCannotRunIsOneClearError) {
  TempDir dir;
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--servers=1", "--workers=2", "--out=" + dir.path(),
                                "gradsync-no-such-command", "train.py"},
                               60);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.err, "gradsync-launch: error: worker 0: cannot run 'gradsync-no-such-command': No such file or directory\n");
  ExpectNothingLeft(dir.path());
}

// --dry-run: every worker's command with its environment; python3 is the build's interpreter;
// BIN_DIR/../python comes first on the PYTHONPATH; the launcher's options end where the command
// starts (an option after it is the command's).
TEST(LaunchCommandTest, DryRunShowsEachCommandWithItsEnvironment) {
  TempDir dir;
  fs::create_directories(dir.File("bin"));
  fs::create_directories(dir.File("python"));
  ProcessResult r = RunProcess({BinaryPath("gradsync-launch"), "--dry-run", "--servers", "2", "--workers=2", "--mode=ssp",
                                "--staleness=3", "--out=o", "--bin-dir=" + dir.File("bin"), "python3", "train.py",
                                "--epochs=3", "--workers=5"},
                               30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;  // scheduler, 2 servers, 2 workers
  const std::string python = std::string(GRADSYNC_PYTHON_EXECUTABLE).empty() ? "python3" : GRADSYNC_PYTHON_EXECUTABLE;
  const char* old_path = std::getenv("PYTHONPATH");
  const std::string python_path = dir.File("python") + (old_path && *old_path ? ":" + std::string(old_path) : "");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(lines[3 + rank], "GRADSYNC_SCHEDULER=127.0.0.1:PORT GRADSYNC_RANK=" + std::to_string(rank) +
                                   " GRADSYNC_OUT=o GRADSYNC_HEARTBEAT_TIMEOUT=10 GRADSYNC_HOST=127.0.0.1 GRADSYNC_MODE=ssp "
                                   "GRADSYNC_STALENESS=3 PYTHONPATH=" + python_path + " " + python + " train.py --epochs=3 --workers=5");
  }
  EXPECT_FALSE(fs::exists("o"));  // a dry run writes nothing
  // After --: flags for gradsync-worker when the first word starts with '-', else a command.
  ProcessResult flags = RunProcess({BinaryPath("gradsync-launch"), "--dry-run", "--", "--lr=0.5"}, 30);
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  EXPECT_NE(flags.out.find("/gradsync-worker --scheduler=127.0.0.1:PORT --rank=0"), std::string::npos) << flags.out;
  EXPECT_NE(flags.out.find(" --lr=0.5\n"), std::string::npos) << flags.out;
  ProcessResult command = RunProcess({BinaryPath("gradsync-launch"), "--dry-run", "--mode=allreduce", "--", "./train", "-v"}, 30);
  ASSERT_EQ(command.exit_code, 0) << command.err;
  EXPECT_NE(WithoutPythonPath(command.out).find("GRADSYNC_BIND=127.0.0.1 GRADSYNC_MODE=allreduce ./train -v\n"),
            std::string::npos)
      << command.out;
  // An option the launcher lacks, before the command, is still an error.
  ProcessResult bad = RunProcess({BinaryPath("gradsync-launch"), "--dry-run", "--epochs=3", "python3", "train.py"}, 30);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "gradsync-launch: error: unrecognised option '--epochs=3' (see --help)\n");
  // An ssp job without its bound is refused, as a spec refuses it (it would run in lockstep).
  ProcessResult ssp = RunProcess({BinaryPath("gradsync-launch"), "--dry-run", "--mode=ssp", "python3", "train.py"}, 30);
  EXPECT_EQ(ssp.exit_code, 2);
  EXPECT_EQ(ssp.err, "gradsync-launch: error: --mode=ssp needs a staleness bound (--staleness=S) (see --help)\n");
  ProcessResult help = RunProcess({BinaryPath("gradsync-launch"), "--help"}, 30);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out.rfind("Usage: gradsync-launch [options] [-- WORKER-FLAGS... | [--] COMMAND [ARGS...]]\n", 0), 0u) << help.out;
  EXPECT_NE(help.out.find("GRADSYNC_SCHEDULER"), std::string::npos);
}

}  // namespace
}  // namespace gradsync::testing
