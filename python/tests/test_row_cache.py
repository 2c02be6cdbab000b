"""ssp's row cache (ARCHITECTURE.md, "Row cache"), through gradsync.torch as a user trains: every
row a forward reads keeps ssp's bound, checked from the values themselves (row_cache_worker.py:
a row read at clock c holds n pushes, and ssp promises every worker's pushes of clocks < c - s,
so n >= 2 (c - s)), apart from what the workers count and what the shards record; the workers'
own count (read_staleness) stays within s too, and the cache serves reads (hits) that the run
without it pulls. Mutations caught: a cached row kept past c - g > s (or its guarantee taken as the
clock it was pulled at, not the shard's answer: the fast worker's rows are s behind when pulled),
a hit that copies another row's values, the counts of hits and pulls swapped or lost."""

import json
import os

import pytest

import gsjob

STALENESS = 2
STEPS = 30


def run(tmp_path, cache):
    result = str(tmp_path / "result")
    env = {r: {"GRADSYNC_ROW_CACHE": "true" if cache else "false"} for r in range(2)}
    out, _, _ = gsjob.run_job("row_cache_worker.py", ["--steps=%d" % STEPS, "--result=" + result], "ssp", 2,
                              servers=2, staleness=STALENESS, out=str(tmp_path / "out"), timeout_s=120,
                              worker_env=env)
    results = [json.load(open("%s-%d.json" % (result, r))) for r in range(2)]
    summaries = [json.load(open(os.path.join(out, "worker-%d.json" % r))) for r in range(2)]
    return results, summaries


@pytest.mark.parametrize("cache", [True, False])
def test_every_read_keeps_the_bound_by_the_values_and_the_workers_count(tmp_path, cache):
    results, summaries = run(tmp_path, cache)
    hits = 0
    for rank, got in enumerate(results):
        assert len(got["reads"]) == STEPS
        for read in got["reads"]:
            c = read["clock"]
            # Every worker's pushes of clocks < c - s are in every row read at clock c.
            assert min(read["pushes"]) >= 2 * (c - STALENESS), (rank, read)
            # Never more than were made: this worker's c and the other's at most c + s + 1.
            assert max(read["pushes"]) <= 2 * c + STALENESS + 1, (rank, read)
            # The 8 rows moved together (each push touches all): a hit copies each its own row.
            assert len(set(read["pushes"])) == 1, (rank, read)
        for s in got["stats"]:
            assert 0 <= s["read_staleness"] <= STALENESS, (rank, s)
            assert s["rows_pulled"] + s["cache_hits"] == 8, (rank, s)
            hits += s["cache_hits"]
        summary = summaries[rank]
        assert 0 <= int(summary["max_read_staleness"]) <= STALENESS
        assert int(summary["rows_pulled"]) + int(summary["cache_hits"]) == 8 * STEPS
        assert int(summary["cache_saved_bytes"]) == 16 * int(summary["cache_hits"])
    if cache:
        # The slow worker's rows are fresh when pulled (it is the last to push): its next reads
        # within the bound come from its cache.
        assert hits >= STEPS // 2, hits
    else:
        assert hits == 0
