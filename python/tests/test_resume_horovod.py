"""Horovod's resume order in every mode (pytorch_imagenet_resnet50.py's: wrap the optimizer, then
rank 0 loads the model and the optimizer state, then broadcast_parameters and
broadcast_optimizer_state): the resumed job ends on the bits of the job that never stopped, with
momentum and with Adam, and with plain SGD (no optimizer state: only the parameters loaded on
rank 0 after wrapping must reach the shards)."""

import pytest

from resume_check import WORKERS, has_state, resumes_bit_for_bit
from test_ps_optimizer_state import ARGS


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("mode", sorted(WORKERS))
def test_horovod_order_resumes_bit_for_bit(tmp_path, mode, kind):
    state = resumes_bit_for_bit(tmp_path, mode, ARGS[kind], horovod_order=True)
    assert has_state(state), "the checkpoint holds no optimizer state to resume"


def test_horovod_order_resumes_plain_sgd_in_bsp(tmp_path):
    resumes_bit_for_bit(tmp_path, "bsp", ["--optimizer=sgd", "--momentum=0"], horovod_order=True)
