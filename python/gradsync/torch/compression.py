"""Horovod's and BytePS's `Compression` objects, mapped onto gradsync's codecs.

    opt = gs.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=gs.Compression.fp16)          # Horovod's name
    opt = gs.DistributedOptimizer(opt, compression=gs.Compression.topk(0.01))  # gradsync's codecs

A compressor here names a native codec (`codec`, the spec gradsync-worker's --compress takes):
DistributedOptimizer hands it to the sync, which compresses on the wire (all-reduce: inside the
ring or as an all-gather; PS: the pushes), with the byte counts of the real payloads. Its
compress()/decompress() are Horovod's interface (a tensor and a context), for code that calls them
directly: they round the values through the codec, so what comes back is what the wire would
deliver.
"""

import torch

from gradsync import _native


class Compressor:
    """A codec by its spec ("" for none). compress(tensor) -> (tensor, ctx); decompress(tensor,
    ctx) -> tensor, as Horovod's Compressor."""

    def __init__(self, codec, name=None):
        if codec and codec != "none":
            _native.Codec(codec)  # a bad spec fails here, with the codec's own message
        self.codec = "" if codec == "none" else codec
        self.name = name or (codec or "none")

    def compress(self, tensor):
        if not self.codec:
            return tensor, None
        if self.codec == "fp16" and tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        flat = tensor.detach().to(torch.float32).contiguous().reshape(-1)
        codec = _native.Codec(self.codec)
        payload = codec.encode(flat.numpy())
        return payload, (tensor.dtype, tensor.shape, codec)

    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        if not isinstance(ctx, tuple):
            return tensor.to(ctx)
        dtype, shape, codec = ctx
        n = 1
        for d in shape:
            n *= d
        return torch.from_numpy(codec.decode(tensor, n)).reshape(shape).to(dtype)

    def __repr__(self):
        return "Compression.%s" % self.name


class Compression:
    """none and fp16 (Horovod's and BytePS's), and gradsync's other codecs."""

    none = Compressor("", "none")
    fp16 = Compressor("fp16", "fp16")
    bf16 = Compressor("bf16", "bf16")
    int8 = Compressor("int8", "int8")
    sign = Compressor("sign", "sign")

    @staticmethod
    def qsgd(levels=256):
        return Compressor("qsgd:%d" % levels, "qsgd(%d)" % levels)

    @staticmethod
    def topk(ratio):
        return Compressor("topk:%g" % ratio, "topk(%g)" % ratio)

    @staticmethod
    def randomk(ratio):
        return Compressor("randomk:%g" % ratio, "randomk(%g)" % ratio)

    @staticmethod
    def codec(spec):
        """Any codec gradsync-worker's --compress takes ("topk:0.01", "qsgd:16", ...)."""
        return Compressor(spec)


def codec_of(compression):
    """The codec spec of `compression`: None (the job's --compress), a spec string, or a
    Compressor. A compressor of another library (compress/decompress in Python) cannot run
    inside the native sync: ValueError."""
    if compression is None:
        return None
    if isinstance(compression, str):
        return compression
    if isinstance(compression, Compressor):
        return compression.codec or "none"
    codec = getattr(compression, "codec", None)
    if isinstance(codec, str):
        return codec
    raise ValueError("compression %r: gradsync compresses natively; pass gradsync.torch.Compression.none / .fp16 / "
                     ".int8 / .sign / .qsgd(L) / .topk(R) / .randomk(R) / .codec(spec), or a codec string"
                     % (compression,))
