"""The examples' Fashion-MNIST helper (examples/pytorch/fashion_mnist.py): the pixels are the host's
shared decoded copy, read-only, and the batches are bit for bit what converting the whole set up
front gave."""

import gzip
import os
import sys

import numpy as np
import pytest
import torch

from gradsync import _native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "pytorch"))
import fashion_mnist  # noqa: E402

DATA = fashion_mnist.DATA_DIR
needs_data = pytest.mark.skipif(
    not os.path.exists(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) and os.environ.get("CI") != "true",
    reason="dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


@needs_data
def test_the_pixels_are_the_files_bytes_read_only_and_shared(tmp_path):
    pixels, labels = _native.fashion_mnist(DATA, "test", str(tmp_path))
    assert pixels.dtype == np.uint8 and pixels.shape == (10000, 28, 28)
    assert np.array_equal(pixels, idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")))
    assert np.array_equal(labels, idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")).astype(np.int64))
    assert not pixels.flags.writeable
    with pytest.raises(ValueError):
        pixels[0, 0, 0] = 1
    # The shared copy is one file of bytes in the cache directory, which a second load maps.
    files = [f for f in os.listdir(tmp_path) if f.endswith(".gsdata")]
    assert len(files) == 1 and os.path.getsize(tmp_path / files[0]) < 10000 * 785 + 100
    again, _ = _native.fashion_mnist(DATA, "test", str(tmp_path))
    assert np.array_equal(again, pixels)
    private, _ = _native.fashion_mnist(DATA, "test", "")
    assert np.array_equal(private, pixels)
    with pytest.raises(ValueError):
        _native.fashion_mnist(DATA, "validation", str(tmp_path))
    with pytest.raises(RuntimeError, match="dataset-fashion-mnist"):
        _native.fashion_mnist(str(tmp_path / "nowhere"), "test", str(tmp_path))


@needs_data
def test_batches_are_the_floats_the_whole_set_converted_up_front_gave(tmp_path):
    pixels, _ = _native.fashion_mnist(DATA, "test", str(tmp_path))
    mean, std = torch.tensor(0.2860), torch.tensor(0.3530)
    # How the examples used to hold the set: every pixel a float32, scaled then standardized.
    whole = (torch.from_numpy(idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255.0)
             .unsqueeze(1) - mean) / std
    images = fashion_mnist.Images(pixels, fashion_mnist._byte_values(mean, std))
    assert len(images) == 10000
    for index in (torch.tensor([5, 0, 9999, 5, 123]), slice(1000, 2000), torch.randperm(10000)[:64]):
        got, want = images[index], whole[index]
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@needs_data
def test_the_mean_and_deviation_are_computed_once_per_host(tmp_path):
    pixels, _ = _native.fashion_mnist(DATA, "test", str(tmp_path))
    here = fashion_mnist._mean_std(pixels, "")
    first = fashion_mnist._mean_std(pixels, str(tmp_path))
    kept = [f for f in os.listdir(tmp_path) if f.startswith("fashion-mnist-train-mean-std-") and f.endswith(".txt")]
    assert len(kept) == 1
    second = fashion_mnist._mean_std(pixels, str(tmp_path))  # read back, not computed
    for a, b, c in zip(here, first, second):
        assert a.dtype == b.dtype == c.dtype == torch.float32
        assert a.item() == b.item() == c.item()
    (tmp_path / kept[0]).write_text("not numbers\n")  # a damaged file is computed again
    assert fashion_mnist._mean_std(pixels, str(tmp_path))[0].item() == here[0].item()


def test_lr_at_is_the_workers_schedule():
    assert _native.lr_at("constant", 0.1, 100, 70) == pytest.approx(0.1)
    assert _native.lr_at("cosine", 0.1, 100, 0) == pytest.approx(0.1)
    assert _native.lr_at("cosine", 0.1, 100, 50) == pytest.approx(0.05)
    assert _native.lr_at("cosine", 0.1, 100, 25) == pytest.approx(0.05 * (1 + np.cos(np.pi / 4)))
    assert _native.lr_at("linear", 0.1, 100, 75) == pytest.approx(0.025)
    assert _native.lr_at("cosine", 0.1, 100, 100) == 0.0
    with pytest.raises(ValueError, match="constant, cosine or linear"):
        _native.lr_at("step", 0.1, 100, 1)
    with pytest.raises(ValueError):
        _native.lr_at("cosine", 0.1, 100, -1)


class _Local:
    """gradsync.torch's functions as train() calls them, for one process without a job."""

    def __init__(self, max_steps):
        self.max_steps = max_steps

    def rank(self):
        return 0

    def size(self):
        return 1

    def config(self):
        return {"max_steps": self.max_steps}


@needs_data
@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_train_sets_each_steps_learning_rate_before_the_step_begins(tmp_path, schedule):
    rates = []

    class Recording(torch.optim.SGD):
        def zero_grad(self, set_to_none=True):  # a PS step begins here: the rate must be set already
            rates.append([g["lr"] for g in self.param_groups])
            super().zero_grad(set_to_none)

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    opt = Recording([{"params": [model[1].weight], "lr": 0.2}, {"params": [model[1].bias]}], lr=0.1)
    args = fashion_mnist.arguments("", epochs=1, batch=16, lr=0.1).parse_args(
        ["--lr-schedule=" + schedule, "--data-cache=" + str(tmp_path)])
    fashion_mnist.train(model, opt, args, _Local(max_steps=12))
    assert len(rates) == 12
    for step, (weight, bias) in enumerate(rates):
        assert weight == pytest.approx(_native.lr_at(schedule, 0.2, 12, step))
        assert bias == pytest.approx(_native.lr_at(schedule, 0.1, 12, step))
    if schedule == "cosine":
        assert rates[0] == pytest.approx([0.2, 0.1]) and rates[-1][0] < 0.01
