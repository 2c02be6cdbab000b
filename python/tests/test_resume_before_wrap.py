"""A rank-0 checkpoint loaded before the optimizer is wrapped (the model's state_dict, then the
optimizer's load_state_dict and broadcast_optimizer_state), in the modes
test_ps_optimizer_state.py's bsp test does not run: all-reduce, ssp and asp, with momentum and
with Adam, resumes bit for bit."""

import pytest

from resume_check import has_state, resumes_bit_for_bit
from test_ps_optimizer_state import ARGS


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("mode", ["allreduce", "asp", "ssp"])
def test_loading_before_wrapping_resumes_bit_for_bit(tmp_path, mode, kind):
    state = resumes_bit_for_bit(tmp_path, mode, ARGS[kind], horovod_order=False)
    assert has_state(state), "the checkpoint holds no optimizer state to resume"
