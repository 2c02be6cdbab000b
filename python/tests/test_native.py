"""The binding's smaller pieces: the codecs as the wire carries them, and the ring's average."""


import numpy as np
import pytest

import gsjob
from gradsync import _native


def test_codecs_round_trip_and_match_their_payload_formula():
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    fp16 = _native.Codec("fp16")
    payload = fp16.encode(x)
    assert len(payload) == fp16.payload_bytes(x.size) == _native.encoded_bytes("fp16", x.size)
    assert np.max(np.abs(fp16.decode(payload, x.size) - x)) < 1e-2
    topk = _native.Codec("topk:0.01")
    y = topk.decode(topk.encode(x), x.size)
    kept = np.flatnonzero(y)
    assert kept.size == 100
    assert np.all(np.abs(x[kept]) >= np.sort(np.abs(x))[-100])  # the largest magnitudes
    with pytest.raises(ValueError):
        _native.Codec("topk:2")
    with pytest.raises(ValueError):
        _native.Codec("none")
    with pytest.raises(_native.GradsyncError):
        topk.decode(b"\x01\x02", x.size)  # a malformed payload is refused, not read


def test_the_ring_averages_in_place(tmp_path):
    code = ("import gradsync as gs, numpy as np\n"
            "job = gs.init()\n"
            "a = np.full(1000, float(gs.rank()), dtype=np.float32)\n"
            "job.allreduce(a)\n"
            "report([float(a.min()), float(a.max())], gs.rank())\n")
    assert gsjob.run_code(tmp_path, code, "allreduce", 3) == [[1.0, 1.0]] * 3
