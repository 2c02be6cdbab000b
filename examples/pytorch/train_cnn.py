"""Fashion-MNIST with a CNN (conv5x5x32-pool-conv5x5x64-pool-fc128-fc10, 454,922 parameters),
trained by every worker of a gradsync job over the parameter server or all-reduce:

    gradsync-launch --servers=2 --workers=4 --mode=ssp --staleness=3 \\
        python3 examples/pytorch/train_cnn.py --epochs=3

Alone (no job: mode local) it is plain PyTorch. The job's settings come from the environment
gradsync-launch sets (GRADSYNC_MODE, GRADSYNC_COMPRESS, ...); this script's flags are the model's
and the optimizer's."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402
from cnn import CNN  # noqa: E402

import gradsync.torch as gs  # noqa: E402


def main():
    p = fashion_mnist.arguments(__doc__, epochs=3, batch=16, lr=0.01)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    args = p.parse_args()
    fashion_mnist.start(args, gs)
    model = CNN()
    if args.optimizer == "sgd":
        base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        base = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt = gs.DistributedOptimizer(base, named_parameters=model.named_parameters())
    if gs.rank() == 0:
        print("train_cnn: mode=%s workers=%d sync=%s params=%d batch=%d (global %d) lr=%g (%s) %s compress=%s precision=%s"
              % (gs.mode(), gs.size(), opt.sync_kind, sum(p.numel() for p in model.parameters()), args.batch,
                 args.batch * gs.size(), args.lr, args.lr_schedule, args.optimizer, gs.config()["compress"], gs.precision()), flush=True)
    fashion_mnist.train(model, opt, args, gs)
    gs.shutdown()


if __name__ == "__main__":
    main()
