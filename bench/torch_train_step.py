#!/usr/bin/python3
"""The PyTorch baseline for gradsync-bench-train-step: the same training step (forward, softmax
cross-entropy, backward, plain SGD update) on the same shapes, timed the same way. Prints one
JSON object per line: {"model", "batch", "threads", "samples_per_s": [one per repeat]}.
Run by the C++ bench; usable alone:  /usr/bin/python3 bench/torch_train_step.py --model mlp --batch 64
"""
import argparse
import ctypes
import json
import os
import time

torch = None  # imported in main(), after the BLAS thread count is in the environment


def blas_threads():
    """The thread count of the OpenBLAS this process loaded (None if it loaded none)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line and ".so" in line}
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path).openblas_get_num_threads()
        except (OSError, AttributeError):
            continue
    return None


def build(model, hidden):
    if model == "softmax":
        return torch.nn.Linear(784, 10)
    layers, last = [], 784
    for h in hidden:
        layers += [torch.nn.Linear(last, h), torch.nn.ReLU()]
        last = h
    layers.append(torch.nn.Linear(last, 10))
    return torch.nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["softmax", "mlp"])
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    # torch.set_num_threads sets PyTorch's own pool, not OpenBLAS's: Debian's torch calls the
    # system OpenBLAS, which otherwise starts a thread per core for every sgemm.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    # PyTorch's OpenMP pool spins between operators by default and starves OpenBLAS's threads
    # (MLP, batch 1024, 2 threads: 27k samples/s spinning, 137k passive): the stronger baseline.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    global torch
    import torch as torch_module
    torch = torch_module
    torch.set_num_threads(a.threads)
    used = blas_threads()
    if used is not None and used != a.threads:
        raise SystemExit("torch_train_step.py: PyTorch's OpenBLAS runs %d threads, not %d" % (used, a.threads))
    torch.manual_seed(0)
    net = build(a.model, [int(h) for h in a.hidden.split(",")])
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    n_batches = 16
    xs = [torch.rand(a.batch, 784) for _ in range(n_batches)]
    ys = [torch.randint(0, 10, (a.batch,)) for _ in range(n_batches)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(xs[i % n_batches]), ys[i % n_batches])
        loss.backward()
        opt.step()

    for i in range(a.warmup):
        step(i)
    rates = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for i in range(a.iters):
            step(i)
        rates.append(a.iters * a.batch / (time.perf_counter() - t0))
    print(json.dumps({"model": a.model, "batch": a.batch, "threads": a.threads,
                      "torch": torch.__version__, "blas_threads": blas_threads(),
                      "samples_per_s": rates}), flush=True)


if __name__ == "__main__":
    main()
