"""ssp under a seeded straggler: every answered pull respects the bound (clock staleness <= s),
as the worker sees it (opt.clock_staleness, the metrics rows) and as the shards count it."""

import csv
import json
import os

import pytest

import gsjob


@pytest.mark.parametrize("bound", [1, 3])
def test_every_answered_pull_respects_the_bound_under_a_straggler(tmp_path, bound):
    record = str(tmp_path / "record")
    out, _, _ = gsjob.run_job("train_worker.py", ["--steps=60", "--record=" + record, "--straggler-rank=2",
                                                  "--straggler-ms=8"],
                              "ssp", 3, servers=2, staleness=bound, out=str(tmp_path / "out"))
    seen = []
    for r in range(3):
        steps = json.load(open("%s-%d.json" % (record, r)))["steps"]
        seen += [s["clock_staleness"] for s in steps if s["clock_staleness"] is not None]
    assert seen and max(seen) <= bound
    assert max(seen) >= 1, "the straggler never made a pull stale: the test would not catch a violation"
    # The metrics rows carry the same column.
    with open(os.path.join(out, "worker-0.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 60 and all(float(row["clock_staleness"]) <= bound for row in rows)
    # The shards' own histograms.
    for k in range(2):
        shard = json.load(open(os.path.join(out, "server-%d.json" % k)))
        worst = max(int(b.get("value", 0)) for b in shard["clock_staleness"])
        assert worst <= bound
