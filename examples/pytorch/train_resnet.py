"""Fashion-MNIST with a small residual network (a 3x3 stem, three stages of two residual blocks
with batch norm, 32-64-128 channels, global average pooling; about 0.7 M parameters), trained by
every worker of a gradsync job:

    gradsync-launch --workers=4 --mode=allreduce python3 examples/pytorch/train_resnet.py --epochs=1

Batch norm's running statistics are buffers, not parameters: every worker keeps its own (as
DistributedDataParallel with broadcast_buffers=False); worker 0 evaluates with its own, and
gs.broadcast_parameters puts worker 0's everywhere at the end."""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402

import gradsync.torch as gs  # noqa: E402


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


class ResNet(nn.Module):
    def __init__(self, widths=(32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main():
    p = fashion_mnist.arguments(__doc__, epochs=1, batch=32, lr=0.05)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    args = p.parse_args()
    fashion_mnist.start(args, gs)
    model = ResNet()
    base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    opt = gs.DistributedOptimizer(base, named_parameters=model.named_parameters())
    if gs.rank() == 0:
        print("train_resnet: mode=%s workers=%d sync=%s params=%d batch=%d (global %d)"
              % (gs.mode(), gs.size(), opt.sync_kind, sum(p.numel() for p in model.parameters()), args.batch,
                 args.batch * gs.size()), flush=True)
    fashion_mnist.train(model, opt, args, gs)
    gs.broadcast_parameters([b for _, b in sorted(model.named_buffers())], root_rank=0)
    gs.shutdown()


if __name__ == "__main__":
    main()
