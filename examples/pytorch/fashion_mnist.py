"""Shared by the examples: Fashion-MNIST from Debian's dataset-fashion-mnist (IDX files), each
worker's shard of every epoch, evaluation, and the per-epoch lines gradsync-worker prints."""

import argparse
import fcntl
import os
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from gradsync import _native

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def arguments(doc, epochs, batch, lr):
    """The flags every example takes (the caller adds its own, then parse_args())."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch", type=int, default=batch, help="per worker (default %d)" % batch)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--lr-schedule", choices=["constant", "cosine", "linear"], default="constant",
                   help="the learning rate over the run's steps, decaying to 0 at the last (default "
                        "constant; gradsync-worker's formulas)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads per worker (default 1)")
    p.add_argument("--data-dir", default=DATA_DIR)
    p.add_argument("--data-cache", default=None,
                   help="where the host's workers share one decoded copy (default: gradsync's, "
                        "$GRADSYNC_DATA_CACHE else ~/.cache/gradsync); off: each worker its own")
    return p


def start(args, gs):
    """PyTorch's threads, the job (gs.init()), and the seed every worker builds its model from."""
    torch.set_num_threads(args.threads)
    gs.init()
    torch.manual_seed(args.seed)


class Images:
    """Images kept as the files hold them (uint8 [N, 28, 28]: a read-only view of the host's shared
    decoded copy, one for every worker on the host) and turned into floats per batch:
    images[idx] is float32 [B, 1, 28, 28], bit for bit what indexing the whole set converted and
    standardized up front gave."""

    def __init__(self, pixels, values):
        self.pixels = pixels  # numpy uint8 [N, 28, 28]
        self.values = values  # numpy float32 [256]: what each byte stands for

    def __len__(self):
        return len(self.pixels)

    def __getitem__(self, idx):
        if isinstance(idx, torch.Tensor):
            idx = idx.numpy()
        return torch.from_numpy(self.values[self.pixels[idx]]).unsqueeze(1)


def _byte_values(mean, std):
    """What each byte stands for: byte / 255 in float32, standardized, by the very operations that
    once converted every pixel."""
    x = torch.from_numpy(np.arange(256, dtype=np.uint8).astype(np.float32) / 255.0)
    return ((x - mean) / std).numpy()


def _mean_std(pixels, cache_dir):
    """The training images' mean and deviation as torch computes them over the float32 images / 255
    (the standardization the examples have always used). Over the whole set that needs the images
    in floats (188 MB): computed once per host, by the first worker, and kept in cache_dir ('':
    here, every time)."""
    def compute():
        x = torch.from_numpy(pixels.astype(np.float32) / 255.0).unsqueeze(1)
        return x.mean(), x.std()
    if not cache_dir:
        return compute()
    key = "%08x-%d-%s" % (zlib.crc32(pixels), torch.get_num_threads(), torch.__version__)
    path = os.path.join(cache_dir, "fashion-mnist-train-mean-std-%s.txt" % key)
    try:
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(path) as f:
                    mean, std = (float.fromhex(v) for v in f.read().split())
                return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
            except (OSError, ValueError):
                mean, std = compute()
                with open(path + ".tmp", "w") as f:
                    f.write("%s %s\n" % (float(mean).hex(), float(std).hex()))
                os.replace(path + ".tmp", path)
                return mean, std
    except OSError as e:
        print("warning: %s: %s; computing the mean and deviation here" % (path, e), file=sys.stderr)
        return compute()


def load(data_dir=DATA_DIR, cache_dir=None):
    """(train_x, train_y, test_x, test_y): images as Images (float32 [B, 1, 28, 28] per batch,
    standardized with the training set's mean and deviation), labels as int64. The pixels are the
    host's shared decoded copy in cache_dir (default: gradsync's, as gradsync-worker's; '': this
    process's own)."""
    if cache_dir is None:
        cache_dir = _native.default_data_cache()
    try:
        train_pixels, train_y = _native.fashion_mnist(data_dir, "train", cache_dir)
        test_pixels, test_y = _native.fashion_mnist(data_dir, "test", cache_dir)
    except (RuntimeError, ValueError) as e:
        raise SystemExit("error: %s" % e)
    values = _byte_values(*_mean_std(train_pixels, cache_dir))
    return (Images(train_pixels, values), torch.from_numpy(train_y),
            Images(test_pixels, values), torch.from_numpy(test_y))


def shard(epoch, n, rank, size, seed):
    """This worker's sample indices for `epoch`: one seeded permutation shared by every worker,
    dealt round-robin (as torch's DistributedSampler), cut to a multiple of size."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(n, generator=g)
    usable = n - n % size
    return order[rank:usable:size]


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    """(mean loss, accuracy) over (x, y)."""
    was_training = model.training
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(x), batch):
        out = model(x[i:i + batch])
        loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
        correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    model.train(was_training)
    return loss / len(x), correct / len(x)


def train(model, opt, args, gs, evaluate_every_epoch=True):
    """The epoch loop: each worker trains on its shard with batch args.batch; worker 0 evaluates
    after every epoch and at the end (the exact final parameters) and prints a line per epoch.
    The job's max_steps (GRADSYNC_MAX_STEPS, a spec's train { max_steps }), when set, ends
    training early. With args.lr_schedule other than constant, every step's learning rate is set
    before the step begins (the PS modes' shards apply the rate a step begins with), decaying over
    the run's steps (max_steps when set) from each parameter group's rate."""
    cache = getattr(args, "data_cache", None)
    train_x, train_y, test_x, test_y = load(args.data_dir, "" if cache == "off" else cache)
    rank, size = gs.rank(), gs.size()
    steps_per_epoch = (len(train_x) // size) // args.batch
    start = time.perf_counter()
    step = opt.steps if hasattr(opt, "steps") else 0
    max_steps = gs.config().get("max_steps", 0) or args.epochs * steps_per_epoch
    if hasattr(opt, "steps_per_epoch"):
        opt.steps_per_epoch = steps_per_epoch  # the epoch column of the metrics rows
    schedule = getattr(args, "lr_schedule", "constant")
    base_lrs = [g["lr"] for g in opt.param_groups]
    last = None
    # The job's --precision: bf16 compute under autocast where torch has it, fp16's dynamic loss
    # scaling (gradsync.torch.GradScaler; a no-op for fp32 and bf16).
    distributed = hasattr(opt, "record_evaluation")
    scaler = gs.GradScaler() if distributed else None
    for epoch in range(step // steps_per_epoch, args.epochs):
        if step >= max_steps:
            break
        mine = shard(epoch, len(train_x), rank, size, args.seed)
        epoch_start, losses = time.perf_counter(), []
        for s in range(step % steps_per_epoch, min(steps_per_epoch, max_steps - epoch * steps_per_epoch)):
            idx = mine[s * args.batch:(s + 1) * args.batch]
            if schedule != "constant":
                for g, base in zip(opt.param_groups, base_lrs):
                    g["lr"] = _native.lr_at(schedule, base, max_steps, epoch * steps_per_epoch + s)
            opt.zero_grad()
            if distributed:
                with gs.autocast():
                    loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
                scaler.scale(loss).backward()
                scaler.step(opt, loss=loss)
                scaler.update()
            else:
                loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
                loss.backward()
                opt.step()
            losses.append(loss.item())
        step = epoch * steps_per_epoch + len(losses)
        rate = len(losses) * args.batch * size / (time.perf_counter() - epoch_start)
        # The last epoch that runs (the last one, or the one max_steps ends in) is evaluated below.
        if rank == 0 and evaluate_every_epoch and epoch + 1 < args.epochs and step < max_steps:
            test_loss, acc = evaluate(model, test_x, test_y)
            if hasattr(opt, "record_evaluation"):
                opt.record_evaluation(test_loss, acc)
            print("epoch %2d/%d  train_loss %.4f  test_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  elapsed %.1fs"
                  % (epoch + 1, args.epochs, sum(losses) / len(losses), test_loss, 100 * acc, rate,
                     time.perf_counter() - start), flush=True)
        last = (sum(losses) / max(1, len(losses)), rate)
    if hasattr(opt, "finish"):
        opt.finish(evaluate=rank == 0)
    if rank == 0:
        test_loss, acc = evaluate(model, test_x, test_y)
        if hasattr(opt, "record_evaluation"):
            opt.record_evaluation(test_loss, acc)
        train_loss, rate = last or (float("nan"), 0.0)
        # The epoch training ended in: the last, or the one max_steps stopped (said so).
        reached = min(args.epochs, -(-step // steps_per_epoch))
        stopped = " (stopped at max_steps %d)" % max_steps if step < args.epochs * steps_per_epoch else ""
        print("epoch %2d/%d  train_loss %.4f  test_loss %.4f  test_acc %6.2f%%  samples/s %8.0f  elapsed %.1fs%s"
              % (reached, args.epochs, train_loss, test_loss, 100 * acc, rate, time.perf_counter() - start, stopped))
        print("final test_acc %.2f%%, %d steps, %.1fs" % (100 * acc, step, time.perf_counter() - start), flush=True)
