"""No forward reads a parameter whose pull has not landed (PS modes, with overlap), whatever the
module does: nn.MultiheadAttention reading out_proj.weight without calling out_proj, the
TransformerEncoderLayer's eval fast path, weight tying through F.linear in the parent's forward,
and a submodule's weight read directly as forward's first operation. stale_worker.py checks
every step (forward == forward again after synchronize_parameters()) and every evaluation.

Torch 1.13's eval fast path (torch._transformer_encoder_layer_fwd) refuses any argument whose
class has a __torch_function__, as the guard's has while a parameter's pull is on its way: so an
evaluation with pulls in flight runs the layers' submodules (each read waiting for its pull),
and one after synchronize_parameters() (every parameter landed, its own class back) takes the
fast path; both are compared with a plain copy of the landed model run the same way."""

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
        if model == "transformer":  # two layers, each on the fast path once every parameter landed
            assert got["fast_in_second"] == 2 * got["evaluations"], got
            assert got["fast_in_first"] == 0, got


def test_transformer_eval_takes_the_fast_path_on_landed_values(tmp_path):
    """The eval fast path runs for real with the guard on, on the pulled values: after
    synchronize_parameters() each layer calls torch._transformer_encoder_layer_fwd, and the
    output equals a plain copy's fast path bit for bit; with pulls in flight the layers refuse
    it (the guard's class), and the output equals the plain copy's slow path."""
    result = str(tmp_path / "result")
    gsjob.run_job("stale_worker.py", ["--model=transformer", "--steps=6", "--eval-every=2", "--result=" + result],
                  "bsp", 2, out=str(tmp_path / "out"), timeout_s=120)
    for r in range(2):
        got = json.load(open("%s-%d.json" % (result, r)))
        assert got["evaluations"] == 3
        assert got["fast_in_second"] == 2 * 3, "each layer's fast path, once per evaluation: %s" % got
        assert got["fast_in_first"] == 0, got
        assert got["eval_mismatches"] == 0, got
        assert got["train_mismatches"] == 0, got


def test_forward_waits_for_a_late_pull(tmp_path):
    """A pull held late: in bsp the shards answer rank 0's pull of step s only once rank 1 pushed
    step s - 1, and rank 1 sleeps 400 ms at the start of every step. Rank 0's forward must have
    waited for it: each forward (s >= 1) ended after rank 1 woke to push the values it read, and
    it read the pulled values (it equals the forward again after synchronize_parameters()). A
    forward that did not wait reads the step before's values, 400 ms before they could come."""
    result = str(tmp_path / "result")
    steps = 6
    gsjob.run_job("stale_worker.py", ["--model=tied", "--steps=%d" % steps, "--eval-every=1000",
                                      "--peer-delay-ms=400", "--result=" + result],
                  "bsp", 2, out=str(tmp_path / "out"), timeout_s=120)
    w0 = json.load(open("%s-0.json" % result))
    w1 = json.load(open("%s-1.json" % result))
    assert len(w0["forward_ends"]) == steps and len(w1["woke"]) == steps
    for s in range(1, steps):
        assert w0["forward_ends"][s] > w1["woke"][s - 1], (
            "step %d: rank 0's forward ended %.0f ms before rank 1 woke to push step %d (forward took %.0f ms): "
            "it did not wait for its pull" % (s, (w1["woke"][s - 1] - w0["forward_ends"][s]) * 1e3, s - 1,
                                              w0["forward_ms"][s]))
    assert w0["train_mismatches"] == 0, "a forward read values other than its step's pull: %s" % w0
