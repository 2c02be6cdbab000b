"""Test support: one gradsync job on 127.0.0.1 (scheduler, servers, and Python workers), bounded
in time; every process it started is killed when it returns."""

import json
import os
import subprocess
import sys
import tempfile
import time

BIN_DIR = os.environ.get("GRADSYNC_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
HERE = os.path.dirname(os.path.abspath(__file__))


def _clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), HERE] if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class JobError(AssertionError):
    pass


def run_job(script, args, mode, workers, servers=1, staleness=None, out=None, timeout_s=120,
            worker_env=None, server_args=(), expect_ok=True):
    """Runs `script args` as every worker of a job of `mode`; returns (out_dir, [worker logs]).
    worker_env: {rank: {VAR: value}} added to that worker's environment."""
    out = out or tempfile.mkdtemp(prefix="gradsync-pytest-")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    port_file = os.path.join(out, "logs", "scheduler.port")
    procs = []
    logs = []

    def spawn(argv, log, env):
        f = open(log, "w")
        procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        f.close()

    env = _clean_env()
    allreduce = mode == "allreduce"
    n_servers = 0 if allreduce else servers
    mode_args = ["--mode=" + mode] + (["--staleness=%d" % staleness] if mode == "ssp" and staleness is not None else [])
    try:
        spawn([os.path.join(BIN_DIR, "gradsync-server"), "--role=scheduler", "--num-servers=%d" % n_servers,
               "--num-workers=%d" % workers, "--port-file=" + port_file, "--heartbeat-timeout=10",
               "--register-timeout=60", "--mode=" + mode],
              os.path.join(out, "logs", "scheduler.log"), env)
        deadline = time.time() + 20
        port = ""
        while not port:
            if os.path.exists(port_file):
                port = open(port_file).read().strip()
            if not port:
                if time.time() > deadline:
                    raise JobError("the scheduler did not start")
                time.sleep(0.02)
        endpoint = "127.0.0.1:" + port
        for s in range(n_servers):
            spawn([os.path.join(BIN_DIR, "gradsync-server"), "--role=server", "--scheduler=" + endpoint,
                   "--rank=%d" % s, "--out=" + out, "--heartbeat-timeout=10"] + mode_args + list(server_args),
                  os.path.join(out, "logs", "server-%d.log" % s), env)
        for w in range(workers):
            wenv = dict(env)
            wenv.update(GRADSYNC_SCHEDULER=endpoint, GRADSYNC_RANK=str(w), GRADSYNC_MODE=mode, GRADSYNC_OUT=out,
                        GRADSYNC_HEARTBEAT_TIMEOUT="10")
            if mode == "ssp" and staleness is not None:
                wenv["GRADSYNC_STALENESS"] = str(staleness)
            wenv.update((worker_env or {}).get(w, {}))
            log = os.path.join(out, "logs", "worker-%d.log" % w)
            logs.append(log)
            spawn([sys.executable, os.path.join(HERE, script)] + [str(a) for a in args], log, wenv)
        end = time.time() + timeout_s
        workers_procs = procs[1 + n_servers:]
        for p in workers_procs:
            p.wait(timeout=max(0.1, end - time.time()))
        codes = [p.returncode for p in workers_procs]
        if expect_ok and any(codes):
            raise JobError("worker exit codes %s; logs:\n%s" % (codes, "\n".join(
                "--- %s\n%s" % (os.path.basename(l), open(l).read()[-3000:]) for l in logs)))
        # The servers and the scheduler end once every worker has finished (a failed job: they
        # are stopped after a few seconds).
        for p in procs[:1 + n_servers]:
            p.wait(timeout=max(0.1, end - time.time() if expect_ok else 5))
        # A job whose workers succeeded while the scheduler or a shard failed is not a success.
        others = [p.returncode for p in procs[:1 + n_servers]]
        if expect_ok and any(others):
            theirs = [os.path.join(out, "logs", "scheduler.log")] + [
                os.path.join(out, "logs", "server-%d.log" % k) for k in range(n_servers)]
            raise JobError("the workers succeeded but the scheduler and servers exited with %s; logs:\n%s" % (others, "\n".join(
                "--- %s\n%s" % (os.path.basename(l), open(l).read()[-3000:]) for l in theirs)))
        return out, logs, codes
    except subprocess.TimeoutExpired:
        raise JobError("the job did not end within %d s; logs in %s" % (timeout_s, out))
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()


def run_code(tmp_path, code, mode, workers):
    """Runs the Python `code` as every worker of a job; it reports by calling report(value), which
    writes the value as JSON. Returns the values by rank."""
    script = tmp_path / "worker_code.py"
    script.write_text("import json, sys\n"
                      "def report(value, rank):\n"
                      "    json.dump(value, open(sys.argv[1] + '-%d.json' % rank, 'w'))\n" + code)
    results = str(tmp_path / "result")
    run_job(str(script), [results], mode, workers, out=str(tmp_path / "out"))
    return [json.load(open("%s-%d.json" % (results, r))) for r in range(workers)]


def read_log(path):
    with open(path) as f:
        return f.read()
