"""A worker for test_uneven.py: a tiny torch.nn.Linear trained with gradsync.torch's
DistributedOptimizer for UNEVEN_STEPS steps (set per rank), then ended with gs.join() when
UNEVEN_JOIN is 1, by simply returning from main() as a Horovod script does (no finish(), no
shutdown()) when UNEVEN_EXIT is 1, else opt.finish(). It prints when it ended (and, if the end or a
step failed, when and why), and writes its final parameters to OUT/params-<rank>.json (not when
it just exits). With UNEVEN_EVAL=1 it records an evaluation after finish() (test_summary.py)."""

import json
import os
import sys
import time

import torch
import torch.nn.functional as F


def main():
    steps = int(os.environ["UNEVEN_STEPS"])
    join = os.environ.get("UNEVEN_JOIN", "0") == "1"
    just_exit = os.environ.get("UNEVEN_EXIT", "0") == "1"
    import gradsync.torch as gs
    gs.init()
    rank = gs.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(steps, 8, 4, generator=g)
    y = torch.randn(steps, 8, 2, generator=g)
    try:
        for s in range(steps):
            opt.zero_grad()
            F.mse_loss(model(x[s]), y[s]).backward()
            opt.step()
        print("worker %d: ran %d steps; ending (join=%s, exit=%s) at %.3f" % (rank, steps, join, just_exit, time.time()),
              flush=True)
        if just_exit:
            return 0
        if join:
            gs.join()
        else:
            opt.finish()
            if os.environ.get("UNEVEN_EVAL", "0") == "1":
                opt.record_evaluation(0.5, 0.25, test_auc=0.75)
    except Exception as e:
        print("worker %d: FAILED at %.3f: %s: %s" % (rank, time.time(), type(e).__name__, e), flush=True)
        raise
    params = [float(v) for v in opt.flat_parameters]
    with open(os.path.join(os.environ["GRADSYNC_OUT"], "params-%d.json" % rank), "w") as f:
        json.dump(params, f)
    print("worker %d: done" % rank, flush=True)
    gs.shutdown()


if __name__ == "__main__":
    sys.exit(main())
