"""Keep torch.nn.parallel.DistributedDataParallel, and let gradsync's ring and codecs average the
gradients through a DDP communication hook:

    gradsync-launch --workers=4 --mode=allreduce python3 examples/pytorch/ddp_hook.py \\
        --compression=topk:0.01 --error-feedback

gs.torch.init_process_group() sets up DDP's gloo group through the gradsync job (no MASTER_ADDR
or MASTER_PORT needed); --hook=none trains with DDP's own gloo all-reduce instead (the baseline
bench/pytorch_compare.sh measures)."""

import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402
from cnn import CNN  # noqa: E402

import gradsync.torch as gs  # noqa: E402


def main():
    p = fashion_mnist.arguments(__doc__, epochs=1, batch=16, lr=0.01)
    p.add_argument("--hook", choices=["gradsync", "none"], default="gradsync")
    p.add_argument("--compression", default=None, help="a codec for the hook (default: none)")
    p.add_argument("--error-feedback", action="store_true")
    args = p.parse_args()
    fashion_mnist.start(args, gs)
    if gs.mode() != "allreduce":
        raise SystemExit("ddp_hook.py: run it with gradsync-launch --mode=allreduce (mode is %s)" % gs.mode())
    gs.init_process_group("gloo")
    model = DistributedDataParallel(CNN())
    if args.hook == "gradsync":
        model.register_comm_hook(None, gs.allreduce_hook(compression=args.compression,
                                                         error_feedback=args.error_feedback))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if gs.rank() == 0:
        print("ddp_hook: workers=%d hook=%s compression=%s" % (gs.size(), args.hook, args.compression), flush=True)
    fashion_mnist.train(model, opt, args, gs)
    torch.distributed.destroy_process_group()
    gs.shutdown()


if __name__ == "__main__":
    main()
