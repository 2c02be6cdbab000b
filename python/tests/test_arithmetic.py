"""DistributedOptimizer's arithmetic against plain torch, step by step (arith_worker.py runs the
cases; this file recomputes each step from the parameters the workers had before it):
op=Average (with gradient_predivide_factor, backward_passes_per_step=2, synchronize() then
skip_synchronize()) equals one torch process stepping SGD on the global batch; op=Sum is N times
it (with synchronize(): a second all-reduce would make it N^2); op=Adasum is the Adasum of the
ranks' own SGD updates, per tensor, by the formula written out below; join() with 2 of 3 workers
still training averages over those 2; every Compression codec is within the error its
definition allows (fp16 and bf16 by their rounding; int8 and QSGD by their levels; sign, top-k
and random-k exactly). Mode allreduce runs every case in one job of 3 workers; the PS modes take
one optimizer per job, so bsp runs one job per case (what the shards refuse, predivide and
Adasum, is not run there)."""

import json
import math

import pytest
import torch

import arith_worker as aw
import gsjob

EPS32 = 2.0 ** -24  # float32's unit roundoff
FP16_U, BF16_U = 2.0 ** -11, 2.0 ** -8

CODECS = ["fp16", "bf16", "int8", "qsgd:16", "sign", "topk:0.1", "randomk:0.1"]
ALLREDUCE_CASES = ["name=average", "name=predivide,predivide=2", "name=sum,op=Sum", "name=adasum,op=Adasum",
                   "name=passes,passes=2", "name=sync,sync=1", "name=sync_sum,op=Sum,sync=1"] + [
    "name=%s,model=flat,compression=%s,steps=1" % (c, c) for c in CODECS] + [
    "name=join,join_steps=1"]  # last: join() ends every optimizer of the process


def run(tmp_path, mode, workers, cases, servers=1):
    result = str(tmp_path / "result")
    gsjob.run_job("arith_worker.py", ["--result=" + result] + cases, mode, workers, servers=servers,
                  out=str(tmp_path / "out"), timeout_s=120)
    return [json.load(open("%s-%d.json" % (result, r))) for r in range(workers)]


@pytest.fixture(scope="module")
def allreduce_results(tmp_path_factory):
    return run(tmp_path_factory.mktemp("allreduce"), "allreduce", 3, ALLREDUCE_CASES)


# --- plain torch ---

def load(model, w):
    with torch.no_grad():
        at = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(w[at:at + n].to(torch.float32).view_as(p))
            at += n


def shapes(kind):
    return [p.numel() for p in aw.build(kind).parameters()]


def grad_of(kind, w, batches):
    """The gradient torch computes at flat parameters w, accumulated over backward passes, each
    on one batch (x, y): float64, flat."""
    model = aw.build(kind)
    load(model, w)
    for x, y in batches:
        aw.loss_of(model, x, y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).to(torch.float64)


def rank_grad(case, w, rank, step):
    return grad_of(case["model"], w, [aw.batch(case["model"], rank, step, k) for k in range(int(case["passes"]))])


def global_batch_grad(case, w, ranks, step):
    """One process on the global batch (the ranks' rows together), each backward pass on its own."""
    batches = []
    for k in range(int(case["passes"])):
        parts = [aw.batch(case["model"], r, step, k) for r in ranks]
        batches.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
    return grad_of(case["model"], w, batches)


def adasum_pair(a, b):
    # Maleki et al. 2021: a * (1 - a.b / 2|a|^2) + b * (1 - a.b / 2|b|^2).
    dot = float(a @ b)
    na, nb = float(a @ a), float(b @ b)
    return (1 - dot / (2 * na) if na else 1.0) * a + (1 - dot / (2 * nb) if nb else 1.0) * b


def adasum_tree(vs):
    # Horovod's order: pairs of neighbouring ranks, then pairs of pairs.
    while len(vs) > 1:
        nxt = [adasum_pair(vs[i], vs[i + 1]) for i in range(0, len(vs) - 1, 2)]
        if len(vs) % 2:
            nxt.append(vs[-1])
        vs = nxt
    return vs[0]


def steps_of(result, name):
    """(w before, w after) of each step of case `name` on rank 0, float64."""
    params = [torch.tensor(p, dtype=torch.float64) for p in result[name]["params"]]
    return list(zip(params, params[1:]))


def applied(w0, w1):
    """The gradient SGD applied between w0 and w1, and the slack float32 parameters allow."""
    return (w0 - w1) / aw.LR, 4 * EPS32 * max(w0.abs().max(), w1.abs().max()).item() / aw.LR


def assert_close(got, want, slack, what, rel=1e-5):
    err = (got - want).abs().max().item()
    bound = rel * want.abs().max().item() + slack
    assert err <= bound, "%s: max |applied - expected| %.3g > %.3g (expected max %.3g)" % (
        what, err, bound, want.abs().max().item())


def check_step(case, w0, w1, ranks, step, what):
    """The applied step against torch, for the cases without a codec."""
    got, slack = applied(w0, w1)
    n = len(ranks)
    if case["op"] == "Adasum":
        sizes = shapes(case["model"])
        combined = []
        at = 0
        for size in sizes:
            deltas = [-aw.LR * rank_grad(case, w0, r, step)[at:at + size] for r in ranks]
            combined.append(adasum_tree(deltas))
            at += size
        want = -torch.cat(combined) / aw.LR
        # Not the average: the formula's result differs from it by far more than the tolerance.
        average = sum(rank_grad(case, w0, r, step) for r in ranks) / n
        assert (want - average).abs().max() > 1e-2 * average.abs().max()
    else:
        want = global_batch_grad(case, w0, ranks, step)
        if case["op"] == "Sum":
            want = n * want
    assert_close(got, want, slack, what)


def check_codec(spec, w0, w1, case, ranks):
    """One step with codec `spec`: each rank's gradient g_r goes through the codec, the results are
    averaged. Within what the codec's definition allows (compression/README.md)."""
    got, slack = applied(w0, w1)
    gs = [rank_grad(case, w0, r, 0) for r in ranks]
    n, size = len(gs), gs[0].numel()
    exact = sum(gs) / n
    absg = sum(g.abs() for g in gs) / n
    err = (got - exact).abs()
    if spec in ("fp16", "bf16"):
        u = FP16_U if spec == "fp16" else BF16_U
        # Each rank's value rounded once, and (all-reduce: summed inside the ring in 16 bits) the
        # partial sums once per addition; the smallest normals' absolute error beside.
        bound = (n + 1) * u * absg + n * 2.0 ** -24 + slack + 1e-6 * exact.abs()
        worst = int((err - bound).argmax())
        assert err[worst] <= bound[worst], "%s: error %.3g at value %d exceeds its bound %.3g" % (
            spec, err[worst].item(), worst, bound[worst].item())
        # And it did round: a 16-bit codec's error shows in 120 values.
        assert err.max().item() > u / 16 * absg.max().item(), "%s: no rounding visible" % spec
    elif spec == "int8":
        # Levels of max|g_r| / 127 (one 512-value bucket): half a level per rank at most.
        bound = sum(g.abs().max().item() / 127 / 2 for g in gs) / n * (1 + 1e-5) + slack
        assert err.max().item() <= bound, "int8: error %.3g > %.3g" % (err.max().item(), bound)
        assert err.max().item() > 0.05 * bound
    elif spec.startswith("qsgd:"):
        levels = int(spec.split(":")[1])
        # Stochastic rounding to a neighbouring level of ||g_r|| / s: less than one level per rank.
        bound = sum(g.norm().item() / levels for g in gs) / n * (1 + 1e-5) + slack
        assert err.max().item() <= bound, "%s: error %.3g > %.3g" % (spec, err.max().item(), bound)
        assert err.max().item() > 0.05 * bound
    elif spec == "sign":
        want = sum(g.abs().sum() / size * torch.sign(g) for g in gs) / n
        assert_close(got, want, slack, spec)
    elif spec.startswith("topk:"):
        k = max(1, round(float(spec.split(":")[1]) * size))
        want = torch.zeros(size, dtype=torch.float64)
        for g in gs:
            idx = g.abs().topk(k).indices
            want[idx] += g[idx] / n
        assert_close(got, want, slack, spec)
    elif spec.startswith("randomk:"):
        k = max(1, round(float(spec.split(":")[1]) * size))
        kept = (got.abs() > slack).nonzero().reshape(-1)
        # The same k indices on every rank, scaled by n/k (unbiased: no error feedback).
        assert kept.numel() == k, "%s: %d values kept, k = %d" % (spec, kept.numel(), k)
        want = torch.zeros(size, dtype=torch.float64)
        want[kept] = exact[kept] * size / k
        assert_close(got, want, slack, spec)
    else:
        raise AssertionError("no rule for " + spec)


# --- mode allreduce: every case in one job ---

@pytest.mark.parametrize("name", ["average", "predivide", "sum", "adasum", "passes", "sync", "sync_sum"])
def test_allreduce_step_equals_torch(allreduce_results, name):
    r0 = allreduce_results[0]
    case = r0[name]["case"]
    for r in allreduce_results[1:]:
        assert r[name]["params"] == r0[name]["params"], "%s: the replicas differ" % name
    steps = steps_of(r0, name)
    assert len(steps) == int(case["steps"])
    for s, (w0, w1) in enumerate(steps):
        check_step(case, w0, w1, [0, 1, 2], s, "%s, step %d" % (name, s + 1))


@pytest.mark.parametrize("spec", CODECS)
def test_allreduce_codec_error_is_the_codecs(allreduce_results, spec):
    r0 = allreduce_results[0]
    for r in allreduce_results[1:]:
        assert r[spec]["params"] == r0[spec]["params"], "%s: the replicas differ" % spec
    (w0, w1), = steps_of(r0, spec)
    check_codec(spec, w0, w1, r0[spec]["case"], [0, 1, 2])


def test_allreduce_join_averages_over_the_workers_still_training(allreduce_results):
    # Rank 2 steps once and joins; ranks 0 and 1 step twice: the second step is theirs alone.
    case = allreduce_results[0]["join"]["case"]
    for r in allreduce_results:
        assert r["join"]["params"][-1] == allreduce_results[0]["join"]["params"][-1]
    (a0, a1), (b0, b1), _ = steps_of(allreduce_results[0], "join")
    check_step(case, a0, a1, [0, 1, 2], 0, "join, step 1 (3 workers)")
    check_step(case, b0, b1, [0, 1], 1, "join, step 2 (workers 0 and 1)")


# --- mode bsp: one job a case ---

@pytest.mark.parametrize("case", ["name=average_passes,passes=2", "name=sum_sync,op=Sum,sync=1"])
def test_bsp_step_equals_torch(tmp_path, case):
    got = run(tmp_path, "bsp", 2, [case])
    name = aw.parse_case(case)["name"]
    assert got[1][name]["params"] == got[0][name]["params"]
    c = got[0][name]["case"]
    for s, (w0, w1) in enumerate(steps_of(got[0], name)):
        check_step(c, w0, w1, [0, 1], s, "%s, step %d" % (name, s + 1))


@pytest.mark.parametrize("spec", CODECS)
def test_bsp_codec_error_is_the_codecs(tmp_path, spec):
    got = run(tmp_path, "bsp", 2, ["name=c,model=flat,compression=%s,steps=1" % spec])
    (w0, w1), = steps_of(got[0], "c")
    check_codec(spec, w0, w1, got[0]["c"]["case"], [0, 1])


def test_bsp_join_averages_over_the_workers_still_training(tmp_path):
    got = run(tmp_path, "bsp", 3, ["name=join,join_steps=1"])
    case = got[0]["join"]["case"]
    for r in got:
        assert r["join"]["params"][-1] == got[0]["join"]["params"][-1]
    (a0, a1), (b0, b1), _ = steps_of(got[0], "join")
    check_step(case, a0, a1, [0, 1, 2], 0, "join, step 1 (3 workers)")
    check_step(case, b0, b1, [0, 1], 1, "join, step 2 (workers 0 and 1)")
