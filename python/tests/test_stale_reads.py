"""No forward reads a parameter whose pull has not landed (PS modes, with overlap), whatever the
module does: nn.MultiheadAttention reading out_proj.weight without calling out_proj, the
TransformerEncoderLayer's eval fast path, weight tying through F.linear in the parent's forward,
and a submodule's weight read directly as forward's first operation. stale_worker.py checks
every step (forward == forward again after synchronize_parameters()) and every evaluation."""

import json

import pytest

import gsjob


@pytest.mark.parametrize("mode", ["bsp", "ssp", "asp"])
@pytest.mark.parametrize("model", ["transformer", "tied"])
def test_forward_reads_only_landed_parameters(tmp_path, mode, model):
    result = str(tmp_path / "result")
    gsjob.run_job("stale_worker.py", ["--model=" + model, "--steps=40", "--result=" + result], mode, 2, servers=2,
                  staleness=1 if mode == "ssp" else None, out=str(tmp_path / "out"), timeout_s=180)
    for r in range(2):
        got = json.load(open("%s-%d.json" % (result, r)))
        assert got["kind"] == "ps-overlap", "the test needs the overlapped sync (pulls landing during forward)"
        assert got["steps"] == 40 and got["evaluations"] == 10
        assert got["train_mismatches"] == 0, got
        assert got["eval_mismatches"] == 0, got
