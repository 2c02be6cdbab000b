#!/usr/bin/python3
"""Runs every `sh` block of README.md and docs/*.md as written, and fails naming the file and line
of each block that exits non-zero or runs past its time.

Usage: docs_commands_test.py REPO_ROOT BUILD_DIR

Each block runs with bash -e -o pipefail in a scratch folder of its own that holds links to the
repository's build (BUILD_DIR, as `build`), `experiments/`, `examples/`, `python/` and `scripts/`,
so that what a block writes (results/...) lands there and not in the checkout. A block preceded
by `<!-- not run by the docs test: REASON -->` is skipped (a reason is required). Port 7000,
which the examples use for a scheduler, becomes a free port for each block, so that the test
can run beside others; a plain `wait` fails when a background process of the block failed. Every
process a block starts is in the block's own process group and is killed when the block ends.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BLOCK_TIMEOUT_S = 240
SKIP = re.compile(r"^<!-- not run by the docs test: (.+) -->$")
LINKED = ["experiments", "examples", "python", "scripts"]
# A plain `wait` returns 0 whatever its jobs returned: here it returns the first failure of the
# block's background processes (a worker that exits 1 fails the block).
PROLOGUE = """wait() {
  if [ $# -gt 0 ]; then builtin wait "$@"; return; fi
  local rc=0 p
  for p in $(jobs -p); do builtin wait "$p" || { [ $rc -ne 0 ] || rc=$?; }; done
  return $rc
}
"""


def blocks(path):
    """(line, code) of every ```sh block, skipping those marked; errors for a mark without reason."""
    found, errors = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                errors.append("%s:%d: an sh block that never closes" % (path, i + 1))
                break
            previous = lines[i - 1].strip() if i > 0 else ""
            if previous.startswith("<!-- not run"):
                if not SKIP.match(previous):
                    errors.append("%s:%d: a skip mark must say why: <!-- not run by the docs test: REASON -->" % (path, i))
            else:
                found.append((start, "\n".join(lines[start:j])))
            i = j
        i += 1
    return found, errors


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_block(code, repo, build):
    scratch = tempfile.mkdtemp(prefix="gradsync-docs-")
    try:
        os.symlink(build, os.path.join(scratch, "build"))
        for name in LINKED:
            os.symlink(os.path.join(repo, name), os.path.join(scratch, name))
        code = re.sub(r"(?<=[:=])7000\b", str(free_port()), code)
        env = dict(os.environ)
        env.pop("GRADSYNC_MAX_STEPS", None)
        start = time.monotonic()
        p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", PROLOGUE + code], cwd=scratch, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=BLOCK_TIMEOUT_S)
            status = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            status = "ran past %d s" % BLOCK_TIMEOUT_S
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever the block left running
        except ProcessLookupError:
            pass
        return status, time.monotonic() - start, out.decode(errors="replace")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    if len(sys.argv) != 3:
        print("usage: docs_commands_test.py REPO_ROOT BUILD_DIR", file=sys.stderr)
        return 2
    repo, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    docs = [os.path.join(repo, "README.md")]
    docs += sorted(os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs")) if f.endswith(".md"))
    failures, ran = [], 0
    for doc in docs:
        found, errors = blocks(doc)
        failures += errors
        for line, code in found:
            where = "%s:%d" % (os.path.relpath(doc, repo), line)
            status, seconds, out = run_block(code, repo, build)
            ran += 1
            print("%s: %s in %.1f s: %s" % (where, "ok" if status == 0 else "FAILED", seconds, code.split("\n")[0][:90]), flush=True)
            if status != 0:
                failures.append("%s: the block exited with %s; its output ends:\n%s" % (where, status, out[-3000:]))
    if ran == 0:
        failures.append("no sh block found in README.md or docs/: the test would prove nothing")
    for f in failures:
        print("FAILED " + f, file=sys.stderr)
    print("docs_commands: %d blocks run, %d failures" % (ran, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
