"""The fault matrix of scripts/fault-table.sh: each row's expected outcome, computed from the
replica placement alone, and each run's observations judged against it. Nothing here reads the scheduler's code: the placement is the
documented one (docs/failures.md, ARCHITECTURE.md's Replication): shard s's backups are the
servers of ranks s+1 .. s+R-1 mod N; when a process is declared dead, the first server in a dead
shard's backup order whose process is not declared dead takes the shard over from its copy, in
its own process, if it holds one (a backup that is not dead but holds no copy takes nothing, and
the ones after it wait for it); a shard server new to the job gets a copy of each shard it backs
up from that shard's primary, if that primary's process is alive then (a killed one sends
nothing), and gives its own shard's live backups in other processes a copy.

  fault_matrix.py rows               the rows, one spec a line
  fault_matrix.py expect SPEC        the expected outcome of one row
  fault_matrix.py judge SPEC DIR HB  the row of the table (spec, expected, observed, match) for the
                                     run in DIR (its logs, summaries and `observed`: the survivors'
                                     exit codes, rc_NAME=CODE, and stop_s, the seconds from the last
                                     kill to the last survivor's exit); exit 1 on a mismatch
SPEC: N:R:KILLED:TIMING[:MODE]. KILLED: server ranks in kill order (1-0), or wN (worker N).
TIMING: one (a single kill), together, before (the second 1 s after the first, before the first's
takeover: the heartbeat timeout is > 1 s), after (the second 1 s after the first's takeover),
restart (R = 1, --checkpoint-dir: the killed servers restarted once declared dead).
"""
import glob
import json
import os
import re
import sys


def backups(s, n, r):
    return [(s + k) % n for k in range(1, min(r, n))]


def simulate(n, r, steps):
    """steps: a list of ("kill", {processes}) and ("declare", {processes}) events in order.
    Returns the list of (event index, shards lost at it)."""
    # A node is a shard server: the rank it serves, its process, the shards it holds a copy of.
    serving = {s: {"rank": s, "proc": s, "holds": {t for t in range(n) if s in backups(t, n, r)}}
               for s in range(n)}
    killed, declared, lost, stages = set(), set(), set(), []

    def settle():
        new_lost = set()
        changed = True
        while changed:
            changed = False
            for s in range(n):
                if serving[s]["proc"] not in declared or s in lost or s in new_lost:
                    continue
                cand = next((serving[b] for b in backups(s, n, r) if serving[b]["proc"] not in declared), None)
                if cand is not None and cand["proc"] in killed:
                    continue  # decided when that process is declared dead too
                if cand is None or s not in cand["holds"]:
                    new_lost.add(s)
                    continue
                cand["holds"].discard(s)
                node = {"rank": s, "proc": cand["proc"], "holds": set()}
                serving[s] = node
                for t in range(n):
                    q = serving[t]
                    if t != s and s in backups(t, n, r) and q["proc"] not in killed and q["proc"] != node["proc"]:
                        node["holds"].add(t)
                for b in backups(s, n, r):
                    q = serving[b]
                    if q["proc"] not in killed and q["proc"] != node["proc"]:
                        q["holds"].add(s)
                changed = True
        return new_lost

    for i, (kind, procs) in enumerate(steps):
        if kind == "kill":
            killed |= procs
        else:
            declared |= procs
            got = settle()
            if got:
                lost |= got
                stages.append((i, got))
    return stages


def parse(spec):
    f = spec.split(":")
    n, r, killed, timing = int(f[0]), int(f[1]), f[2], f[3]
    mode = f[4] if len(f) > 4 else "bsp"
    return n, r, killed, timing, mode


def expect(spec):
    """(outcome, shards lost, shards the verdict may name): outcome is "completes" (nothing
    lost), "stops" (naming shards, within the heartbeat timeout + 5 s) or "recovers" (from the
    checkpoints, losses counted)."""
    n, r, killed, timing, _ = parse(spec)
    if killed.startswith("w"):
        return "completes", set(), set()
    ks = [int(k) for k in killed.split("-")]
    if timing in ("one", "restart") or timing == "together":
        orders = [[("kill", set(ks)), ("declare", set(ks))]]
        if len(ks) == 2:  # declared a heartbeat apart, either way round
            a, b = ks
            orders += [[("kill", set(ks)), ("declare", {a}), ("declare", {b})],
                       [("kill", set(ks)), ("declare", {b}), ("declare", {a})]]
    elif timing == "before":
        a, b = ks
        orders = [[("kill", {a}), ("kill", {b}), ("declare", {a}), ("declare", {b})]]
    elif timing == "after":
        a, b = ks
        orders = [[("kill", {a}), ("declare", {a}), ("kill", {b}), ("declare", {b})]]
    else:
        raise SystemExit(f"{spec}: unknown timing {timing}")
    results = [simulate(n, r, o) for o in orders]
    lost = [set().union(*[s for _, s in st]) for st in results]
    if any(l != lost[0] for l in lost):
        raise SystemExit(f"{spec}: the placement gives different losses for different declaration orders: {lost}")
    lost = lost[0]
    if not lost:
        return "completes", set(), set()
    if timing == "restart":
        return "recovers", lost, lost
    # The verdict names what is lost when it comes: the first stage's shards (together: the
    # declarations a heartbeat apart may split them, so any of them).
    first = set().union(*[st[0][1] for st in results])
    return "stops", lost, first


def rows():
    out = []
    for n in (2, 3, 4):
        for a in range(n):
            out.append(f"{n}:1:{a}:one")
            out.append(f"{n}:2:{a}:one")
        for a in range(n):
            for b in range(a + 1, n):
                out.append(f"{n}:1:{a}-{b}:restart")
                out.append(f"{n}:2:{a}-{b}:together")
                for x, y in ((a, b), (b, a)):
                    out.append(f"{n}:2:{x}-{y}:before")
                    out.append(f"{n}:2:{x}-{y}:after")
    for mode in ("bsp", "ssp", "asp"):
        out.append(f"2:1:w1:one:{mode}")
    return out


def shards_text(s):
    return ",".join(str(x) for x in sorted(s))


def expected_text(spec):
    outcome, lost, name = expect(spec)
    if outcome == "completes":
        return "completes, nothing lost"
    if outcome == "recovers":
        return f"recovers shard {shards_text(lost)} from checkpoints, losses counted"
    named = shards_text(name) if len(name) == 1 else "of " + shards_text(name)
    return f"stops within timeout+5 s naming shard {named}"


def named_shards(text):
    """The shards a "shard S is lost" / "shards S, T are lost" line names."""
    m = re.search(r"shards? ([0-9, ]+) (?:is|are) lost", text)
    return {int(x) for x in m.group(1).split(",")} if m else set()


def judge(spec, d, hb):
    outcome, lost, name = expect(spec)
    n, r, killed, timing, _ = parse(spec)
    obs = {}
    with open(os.path.join(d, "observed")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            obs[k] = v
    read = lambda p: open(p, errors="replace").read() if os.path.exists(p) else ""
    sched = read(os.path.join(d, "scheduler.log"))
    rcs = {k[3:]: int(v) for k, v in obs.items() if k.startswith("rc_")}  # the survivors' exit codes
    stop_s = float(obs.get("stop_s", "-1"))
    # Each shard's summary, written by the process that served it last.
    summary = {int(m.group(1)): json.load(open(p)) for p in glob.glob(os.path.join(d, "server-*.json"))
               if (m := re.search(r"server-(\d+)\.json$", p))}
    lost_updates = sum(int(s.get("lost_updates", 0)) for s in summary.values())
    ranks = set(summary)
    problems = []
    if obs.get("setup"):
        problems.append(obs["setup"])
    said = named_shards(sched)
    if outcome == "stops":
        nonzero = [k for k, v in rcs.items() if v != 0]
        observed = f"stopped after {stop_s:.1f} s naming shard {shards_text(said) or '-'}, {len(nonzero)} of {len(rcs)} exit non-zero"
        # One shard lost names it; several may be named in part (declared a heartbeat apart).
        if not said or not said <= name or (len(name) == 1 and said != name):
            problems.append(f"named {shards_text(said) or 'no shard'}")
        if len(nonzero) != len(rcs):
            problems.append("exit 0: " + " ".join(k for k, v in rcs.items() if v == 0))
        if stop_s < 0 or stop_s > hb + 5:
            problems.append(f"stopped after {stop_s} s (> {hb + 5})")
        for w in glob.glob(os.path.join(d, "worker-*.log")):
            if not named_shards(" ".join(l for l in read(w).splitlines() if "the scheduler stopped the job" in l)):
                problems.append(os.path.basename(w) + " does not name the shard")
    else:
        bad = [f"{k}={v}" for k, v in rcs.items() if v != 0]
        observed = f"completed ({'every survivor exits 0' if not bad else 'exit ' + ' '.join(bad)}), {lost_updates} updates lost"
        if bad:
            problems.append("non-zero exit")
        if said:
            problems.append(f"scheduler said shard {shards_text(said)} is lost")
        if not killed.startswith("w") and ranks != set(range(n)):
            problems.append(f"summaries of shards {shards_text(ranks)} only")
        if outcome == "completes" and lost_updates != 0:
            problems.append(f"{lost_updates} updates lost")
        if outcome == "recovers":
            waited = {int(s) for s in re.findall(r"shard (\d+) has no live copy", sched)}
            restored = sum("restored from" in read(p) for p in glob.glob(os.path.join(d, "server-*-restarted.log")))
            observed += f", restored {restored}, awaited shard {shards_text(waited) or '-'}"
            if waited != lost:
                problems.append(f"awaited shard {shards_text(waited) or '-'}")
            if restored != len(lost):
                problems.append(f"{restored} restored")
            if lost_updates <= 0:
                problems.append("no update counted lost")
    ok = not problems
    print(f"| {spec} | {expected_text(spec)} | {observed}{'' if ok else ' (' + '; '.join(problems) + ')'} | "
          f"{'yes' if ok else 'NO'} |")
    return ok


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "rows":
        print("\n".join(rows()))
    elif cmd == "expect":
        print(expected_text(sys.argv[2]))
    elif cmd == "judge":
        sys.exit(0 if judge(sys.argv[2], sys.argv[3], float(sys.argv[4])) else 1)
