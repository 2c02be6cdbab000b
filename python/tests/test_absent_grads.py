"""PS modes: a parameter that got no gradient in a step is treated as torch's optimizer treats it:
left alone (momentum, weight decay and Adam's step count included) when its .grad is None (never
had one, or zero_grad(set_to_none=True) since), stepped on its zeroed .grad after
zero_grad(set_to_none=False). A bsp job equals plain torch on the same rows either way."""

import pytest
import torch

import absent_worker
import gsjob


def run(tmp_path, mode, optimizer, workers=2, extra=("--set-to-none",)):
    save = str(tmp_path / "final.pt")
    args = ["--optimizer=" + optimizer, "--workers=%d" % workers, "--save=" + save] + list(extra)
    gsjob.run_job("absent_worker.py", args, mode, workers, servers=2, staleness=1 if mode == "ssp" else None,
                  out=str(tmp_path / "out"))
    return torch.load(save)


def reference(tmp_path, optimizer, workers, extra):
    save = str(tmp_path / "reference.pt")
    absent_worker.main(["--optimizer=" + optimizer, "--workers=%d" % workers, "--reference", "--save=" + save] +
                       list(extra))
    return torch.load(save)


@pytest.mark.parametrize("optimizer,set_to_none", [("sgd", True), ("adam", True), ("adam", False)])
def test_bsp_treats_what_had_no_gradient_as_torch_does(tmp_path, optimizer, set_to_none):
    extra = ("--set-to-none",) if set_to_none else ()
    got, want = run(tmp_path, "bsp", optimizer, extra=extra), reference(tmp_path, optimizer, 2, extra)
    # The never-used layer: not moved by weight decay or momentum, bit for bit.
    for name in ("never.weight", "never.bias"):
        assert torch.equal(got["params"][name], got["init"][name]), name + " moved without a gradient"
    # Every parameter as torch computes it on the same rows (float rounding: the shards' update
    # is torch's operation by operation, not always its fused kernels).
    for name, value in want["params"].items():
        assert torch.allclose(got["params"][name], value, rtol=1e-5, atol=1e-6), \
            "%s: max difference %g" % (name, (got["params"][name] - value).abs().max())
    # torch's state: no entry for the never-used layer; Adam's step per parameter (the sometimes-
    # used layer took 3 of the 6 steps).
    assert sorted(got["state"]) == sorted(want["state"])
    assert "never.weight" not in got["state"]
    for name, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.allclose(got["state"][name][key], value, rtol=1e-5, atol=1e-6), (name, key)
    if optimizer == "adam":
        # set_to_none: the sometimes-used layer took 3 of the 6 steps; else all 6 (zero gradients).
        assert float(got["state"]["sometimes.weight"]["step"]) == (3 if set_to_none else 6)
        assert float(got["state"]["always.weight"]["step"]) == 6


@pytest.mark.parametrize("mode,optimizer,extra", [
    ("ssp", "sgd", ("--set-to-none",)), ("asp", "adam", ()),
    # Without overlap (a codec makes the push one message per shard), the same.
    ("bsp", "sgd", ("--compression=fp16", "--set-to-none")),
])
def test_the_never_used_layer_stays_put(tmp_path, mode, optimizer, extra):
    got = run(tmp_path, mode, optimizer, extra=extra)
    for name in ("never.weight", "never.bias"):
        assert torch.equal(got["params"][name], got["init"][name]), name + " moved without a gradient"
    for name in ("always.weight", "sometimes.weight"):
        assert not torch.equal(got["params"][name], got["init"][name]), name + " was not trained"
