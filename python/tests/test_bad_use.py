"""Bad use gets one clear Python exception: before init(), models that differ between workers
(the message names the parameter), an optimizer the shards cannot apply, a bad setting."""

import os
import subprocess
import sys

import pytest
import torch

import gsjob


def test_calls_before_init_raise_value_error():
    import gradsync.torch as gs
    with pytest.raises(ValueError, match="call gradsync.init"):
        gs.rank()
    with pytest.raises(ValueError, match="call gradsync.init"):
        gs.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(ValueError, match="call gradsync.init"):
        gs.broadcast_parameters({"w": torch.zeros(2)})


def run_python(code, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_a_bad_setting_is_a_value_error_that_names_it():
    r = run_python("import gradsync as gs\ntry:\n gs.init(['--mode=ssp', '--staleness=-1'])\n"
                   "except ValueError as e:\n print('ValueError:', e)\n")
    assert "ValueError:" in r.stdout and "staleness" in r.stdout, r.stdout + r.stderr
    r = run_python("import gradsync as gs\ntry:\n gs.init(['--compress=topk:2'])\n"
                   "except ValueError as e:\n print('ValueError:', e)\n")
    assert "ValueError:" in r.stdout and "compress" in r.stdout, r.stdout + r.stderr


def test_init_twice_is_refused():
    r = run_python("import gradsync as gs\ngs.init()\ntry:\n gs.init()\nexcept ValueError as e:\n print('ValueError:', e)\n")
    assert "ValueError: gradsync.init() was called already" in r.stdout, r.stdout + r.stderr


def failed_job(tmp_path, mode, workers, args):
    out, logs, codes = gsjob.run_job("train_worker.py", ["--steps=5"] + args, mode, workers, servers=1,
                                     out=str(tmp_path), expect_ok=False, timeout_s=60)
    assert all(c != 0 for c in codes), codes
    return [gsjob.read_log(l) for l in logs]


@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_workers_whose_shapes_differ_are_told_which_parameter(tmp_path, mode):
    for log in failed_job(tmp_path, mode, 2, ["--hidden-rank=1"]):
        assert "ValueError: the workers' models differ: parameter 'fc1.weight' has shape [32, 20] on worker 0 " \
               "but [40, 20] on worker 1" in log, log


def test_workers_whose_names_differ_are_told_which_parameter(tmp_path):
    for log in failed_job(tmp_path, "allreduce", 2, ["--rename-rank=1"]):
        assert "parameter 2 is 'fc2.weight' on worker 0 but 'out.weight' on worker 1" in log, log


def test_an_optimizer_the_shards_cannot_apply_is_refused_in_ps_modes(tmp_path):
    (log,) = failed_job(tmp_path, "bsp", 1, ["--optimizer=rmsprop"])
    assert "ValueError: mode bsp: the parameter servers apply the update" in log and "RMSprop" in log, log
