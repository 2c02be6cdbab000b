"""A worker for test_stale_reads.py: models whose forward reads parameters outside their own
module's forward, trained with gradsync.torch in a PS mode with overlap, checking every step that
forward read exactly the parameters the step pulled.

  transformer  nn.TransformerEncoder (nn.MultiheadAttention reads out_proj.weight without calling
               out_proj; in eval the encoder layer's fast path calls none of its submodules)
  tied         an embedding whose weight is also the output layer's (F.linear in the parent's
               forward), and a submodule's weight read directly as the first thing forward does

Each step: zero_grad, forward (out), backward; then synchronize_parameters() (every pull of the
step has landed) and the same forward again under no_grad (again). out must equal again bit for
bit: a forward that read a parameter before its pull landed, or while it was landing, computed
with other values. Every --eval-every steps the model is evaluated on held-out rows (first: the
parameters still on their way, so the transformer's layers refuse torch's eval fast path and run
their submodules), then again after synchronize_parameters() (second: every parameter landed, so
the layers take the fast path, torch._transformer_encoder_layer_fwd, counted here). Each is
compared bit for bit with a plain copy of the landed model run the same way: first with the slow
path (grad enabled), second with the fast path (no_grad). The worker writes RESULT-<rank>.json
with the counts, and exits 0 either way (the test reads them).

--peer-delay-ms=D (bsp): rank 1 sleeps D ms at the start of every step, so that rank 0's pulls,
which the shards answer only once both workers pushed the step before, arrive D ms late: rank 0
records when each forward ended, rank 1 when it woke (the tests compare them: a forward that read
the pulled values ended after the peer woke to push them).
"""

import argparse
import copy
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradsync.torch as gs

VOCAB, DIM, SEQ = 64, 32, 12


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.gain = nn.Linear(DIM, 1, bias=False)  # never called: its weight is read directly
        self.mix = nn.Linear(DIM, DIM)

    def forward(self, x):
        scale = 1.0 + self.gain.weight.reshape(-1)  # the first read of this forward
        h = torch.tanh(self.mix(self.embed(x) * scale))
        return F.linear(h, self.embed.weight)  # the output layer is the embedding


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["transformer", "tied"], required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--result", required=True)
    p.add_argument("--peer-delay-ms", type=float, default=0)
    args = p.parse_args()

    # Every call of the transformer layer's eval fast path (torch 1.13 looks it up on torch at
    # each call).
    fast_path = [0]
    fused = torch._transformer_encoder_layer_fwd

    def counted(*a, **k):
        fast_path[0] += 1
        return fused(*a, **k)
    torch._transformer_encoder_layer_fwd = counted

    gs.init()
    torch.manual_seed(0)
    model = Transformer() if args.model == "transformer" else Tied()
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(100 + gs.rank())
    test_x = torch.randint(0, VOCAB, (8, SEQ), generator=torch.Generator().manual_seed(7))
    train_mismatches = eval_mismatches = evaluations = 0
    fast_in_first = fast_in_second = 0
    forward_ends, forward_ms, woke = [], [], []
    worst = 0.0
    for step in range(args.steps):
        if args.peer_delay_ms and gs.rank() == 1:
            time.sleep(args.peer_delay_ms / 1e3)
            woke.append(time.time())
        x = torch.randint(0, VOCAB, (16, SEQ), generator=g)
        y = torch.roll(x, 1, dims=1)
        opt.zero_grad()
        started = time.time()
        out = model(x)
        forward_ends.append(time.time())
        forward_ms.append((forward_ends[-1] - started) * 1e3)
        loss = F.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.synchronize_parameters()
        with torch.no_grad():
            again = model(x)
        if not torch.equal(out.detach(), again):
            train_mismatches += 1
            worst = max(worst, float((out.detach() - again).abs().max()))
        opt.step(loss=loss)
        if (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                calls = fast_path[0]
                first = model(test_x)
                fast_in_first += fast_path[0] - calls
                opt.synchronize_parameters()
                calls = fast_path[0]
                second = model(test_x)
                fast_in_second += fast_path[0] - calls
            model.train()
            # The landed values, in a plain copy: its slow path (grad enabled) and its fast path.
            reference = copy.deepcopy(model).eval()
            with torch.enable_grad():
                slow = reference(test_x).detach()
            with torch.no_grad():
                fast = reference(test_x)
            evaluations += 1
            for got, want in ((first, slow), (second, fast)):
                if not torch.equal(got, want):
                    eval_mismatches += 1
                    worst = max(worst, float((got - want).abs().max()))
    opt.finish()
    with open("%s-%d.json" % (args.result, gs.rank()), "w") as f:
        json.dump(dict(steps=args.steps, train_mismatches=train_mismatches, evaluations=evaluations,
                       eval_mismatches=eval_mismatches, worst=worst if math.isfinite(worst) else -1,
                       kind=opt.sync_kind, loss=float(loss), fast_in_first=fast_in_first,
                       fast_in_second=fast_in_second, forward_ends=forward_ends, forward_ms=forward_ms,
                       woke=woke), f)


if __name__ == "__main__":
    main()
