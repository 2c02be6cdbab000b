"""gradsync.torch.Embedding / EmbeddingBag: tables that live on the shards (PS modes), in each
worker's replica (allreduce) or in the process (local), never whole in a worker. N workers in bsp
equal one process stepping on the N-times batch; bad ids and mismatched tables get one line."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

import gsjob

HERE = os.path.dirname(os.path.abspath(__file__))


def one_process(tmp_path, args):
    """table_worker.py in mode local: the reference."""
    save = str(tmp_path / "reference.pt")
    env = gsjob._clean_env()
    subprocess.run([sys.executable, os.path.join(HERE, "table_worker.py"), "--save=" + save] + args, env=env,
                   check=True, timeout=120, stdout=subprocess.DEVNULL)
    return torch.load(save)


def job(tmp_path, mode, workers, args, servers=2, expect_ok=True):
    save = str(tmp_path / "job.pt")
    record = str(tmp_path / "record")
    out, logs, codes = gsjob.run_job("table_worker.py", ["--workers=%d" % workers, "--save=" + save,
                                                         "--record=" + record] + args,
                                     mode, workers, servers=servers, out=str(tmp_path / "out"), expect_ok=expect_ok)
    if not expect_ok:
        return logs, codes
    records = [json.load(open("%s-%d.json" % (record, r))) for r in range(workers)]
    return torch.load(save), records


def plain_pytorch(tmp_path, args):
    """table_worker.py --reference: plain PyTorch (torch.optim.SGD on nn.Embedding's sparse gradient)."""
    save = str(tmp_path / "plain.pt")
    subprocess.run([sys.executable, os.path.join(HERE, "table_worker.py"), "--reference", "--save=" + save] + args,
                   env=gsjob._clean_env(), check=True, timeout=120, stdout=subprocess.DEVNULL)
    return torch.load(save)


def largest_difference(got, ref):
    """The largest difference of any dense parameter or touched row, relative to its largest value."""
    assert got["ids"] == ref["ids"] and set(got["rows"]) == set(ref["rows"])
    worst = 0.0
    for part in ("dense", "rows"):
        for k, r in ref[part].items():
            worst = max(worst, ((got[part][k] - r).abs().max() / r.abs().max()).item())
    return worst


@pytest.mark.parametrize("tables", ["plain", "plain-bag"])
def test_a_plain_sparse_embedding_in_allreduce_equals_plain_pytorch_on_the_global_batch(tmp_path, tables):
    args = ["--tables=" + tables, "--steps=20"]
    got, _ = job(tmp_path, "allreduce", 2, args + ["--batch=32"])
    ref = plain_pytorch(tmp_path, args + ["--workers=1", "--batch=64"])
    assert largest_difference(got, ref) <= 1e-5


@pytest.mark.parametrize("mode", ["ssp", "asp"])
def test_one_worker_in_ssp_and_asp_equals_one_process(tmp_path, mode):
    # One worker: every push is applied before its next pull, so the rows move as locally (mode
    # mean bags: two rows averaged per bag, lazy Adam's per-row step counts).
    args = ["--tables=bag", "--bag-mode=mean", "--row-optimizer=adam", "--lr=0.05", "--steps=20", "--batch=32"]
    got, records = job(tmp_path, mode, 1, args, servers=2)
    ref = one_process(tmp_path, args + ["--workers=1"])
    assert largest_difference(got, ref) <= 1e-5
    assert records[0]["sync"] == "ps"


@pytest.mark.parametrize("mode,tables,row_optimizer", [
    ("bsp", "bag", "sgd"), ("bsp", "bag", "adagrad"), ("bsp", "embedding", "sgd"),
    ("allreduce", "bag", "sgd"), ("allreduce", "bag", "adagrad"), ("allreduce", "embedding", "adam")])
def test_two_workers_equal_one_process_on_the_global_batch(tmp_path, mode, tables, row_optimizer):
    # bsp: 2 servers x 2 workers, a round's row gradients merged on the shards. allreduce: each
    # worker keeps a replica of the tables; a step's ids and row gradients are all-gathered (as
    # Horovod and DDP do for sparse gradients) and every replica applies their mean.
    args = ["--tables=" + tables, "--row-optimizer=" + row_optimizer, "--steps=20"]
    got, records = job(tmp_path, mode, 2, args + ["--batch=32"])
    ref = one_process(tmp_path, args + ["--workers=1", "--batch=64"])
    assert largest_difference(got, ref) <= 1e-5
    assert records[0]["sync"] == ("ps" if mode == "bsp" else "allreduce-tables")
    # Each step hands over the rows its batch touched (two ids a bag), summed per id: of 3 x 1000,
    # and the metrics rows count them (table_rows).
    assert all(0 < n <= 3 * 2 * 32 for r in records for n in r["rows_per_step"])
    with open(str(tmp_path / "out" / "worker-1.csv")) as f:
        rows = list(csv.DictReader(f))
    trained = [int(r["table_rows"]) for r in rows if r["test_loss"] == ""]
    assert trained and trained == records[1]["rows_per_step"][:len(trained)]


@pytest.mark.parametrize("tables,bag_mode", [("plain", "sum"), ("plain-bag", "sum"), ("plain-bag", "mean")])
def test_a_plain_sparse_embedding_in_bsp_equals_plain_pytorch_on_the_global_batch(tmp_path, tables, bag_mode):
    # nn.Embedding(sparse=True) / nn.EmbeddingBag(sparse=True) through DistributedOptimizer: its
    # rows travel as a table's, and 2 servers x 2 workers end where torch.optim.SGD does alone.
    args = ["--tables=" + tables, "--bag-mode=" + bag_mode, "--steps=20"]
    got, records = job(tmp_path, "bsp", 2, args + ["--batch=32"])
    ref = plain_pytorch(tmp_path, args + ["--workers=1", "--batch=64"])
    assert largest_difference(got, ref) <= 1e-5
    assert all(0 < n <= 3 * 2 * 32 for r in records for n in r["rows_per_step"])


def test_a_plain_sparse_embedding_is_never_densified_unless_sparse_as_dense(tmp_path):
    # The rows a step touched travel, not the table: 3 tables of 1000 x 8 floats are 96 KB a step
    # dense, a few dozen rows sparse. sparse_as_dense=True (Horovod's) densifies them, and trains the same.
    args = ["--tables=plain", "--steps=20", "--batch=32"]
    (tmp_path / "rows").mkdir()
    (tmp_path / "dense").mkdir()
    rows, rows_records = job(tmp_path / "rows", "bsp", 2, args)
    dense, dense_records = job(tmp_path / "dense", "bsp", 2, args + ["--sparse-as-dense"])
    assert largest_difference(rows, dense) <= 1e-5
    sent = [sum(r["traffic"][:1]) + r["shm_traffic"][0] for r in rows_records]
    sent_dense = [sum(r["traffic"][:1]) + r["shm_traffic"][0] for r in dense_records]
    assert all(s < 0.3 * d for s, d in zip(sent, sent_dense)), (sent, sent_dense)
    assert all(n == 0 for r in dense_records for n in r["rows_per_step"])


def test_padding_rows_stay_zero_and_bsp_still_equals_one_process(tmp_path):
    args = ["--tables=bag", "--padding=0", "--steps=15"]
    got, _ = job(tmp_path, "bsp", 2, args + ["--batch=32"])
    ref = one_process(tmp_path, args + ["--workers=1", "--batch=64"])
    assert largest_difference(got, ref) <= 1e-5
    # nn.Embedding's padding row (padding_idx=0 in every table): zeros, whatever the rule would make it.
    at = got["ids"].index(0)
    assert all(rows[at].abs().max().item() == 0.0 for rows in got["rows"].values())
    assert all(rows[at + 1].abs().max().item() > 0.0 for rows in got["rows"].values())


def test_a_wrong_update_is_caught(tmp_path):
    # The comparison can fail: another rate for the rows' optimizer is far away.
    args = ["--tables=bag", "--steps=10"]
    got, _ = job(tmp_path, "bsp", 2, args + ["--batch=32"])
    other = one_process(tmp_path, args + ["--workers=1", "--batch=64", "--lr=0.12"])
    assert largest_difference(got, other) > 1e-3


def test_the_state_dict_holds_sharded_weights_that_read_rows_and_pickle_without_them(tmp_path):
    # Rank 0 saved rows read through state_dict()["tables.k.weight"][ids]; broadcast_parameters of the
    # state_dict ran before training and moved none of them.
    got, records = job(tmp_path, "asp", 1, ["--steps=5", "--batch=16"], servers=1)
    assert records[0]["kinds"].count("ShardedWeight") == 3
    assert all(rows.shape == (len(got["ids"]), 8) for rows in got["rows"].values())
    import gradsync.torch as gs
    w = gs.ShardedWeight.__new__(gs.ShardedWeight)
    w.__dict__.update({"name": "t", "num_embeddings": 2**30, "embedding_dim": 32, "_table": None})
    path = str(tmp_path / "sd.pt")
    torch.save({"t.weight": w}, path)
    assert os.path.getsize(path) < 4096  # the description, no rows
    loaded = torch.load(path)["t.weight"]
    assert tuple(loaded.shape) == (2**30, 32)
    with pytest.raises(ValueError, match="no rows"):
        loaded[[1, 2]]


@pytest.mark.parametrize("bad,message", [(5000, "table 'embedding0': id 5000 is outside the table's 1000 ids"),
                                         (-3, "table 'embedding0': id -3 is negative")])
def test_a_bad_id_is_one_line_and_the_worker_exits_non_zero(tmp_path, bad, message):
    logs, codes = job(tmp_path, "bsp", 1, ["--steps=5", "--bad-id=%d" % bad], servers=1, expect_ok=False)
    assert codes[0] != 0
    assert message in gsjob.read_log(logs[0])


def test_a_row_dimension_that_differs_between_workers_is_refused_when_the_job_forms(tmp_path):
    logs, codes = job(tmp_path, "bsp", 2, ["--steps=5", "--dim-rank=1"], expect_ok=False)
    assert codes[0] != 0 and codes[1] != 0
    text = gsjob.read_log(logs[1])
    assert "the workers' models differ" in text and "[table embedding0]" in text and "[1000, 9]" in text


def test_a_table_that_outgrows_its_bound_is_one_line_naming_it(tmp_path):
    logs, codes = job(tmp_path, "bsp", 1, ["--steps=5", "--max-rows=20"], servers=1, expect_ok=False)
    assert codes[0] != 0
    text = gsjob.read_log(logs[0])
    assert "table 'embedding0'" in text and "bound of 20 rows per shard" in text, text[-2000:]
