#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (deterministic; python3 standard library).

    python3 fuzz/make_corpus.py          # rewrites fuzz/corpus/ (the regress_* inputs stay)

fuzz_message: raw-mode inputs (byte 0 bit 1 clear: explicit frames) holding real wire::Header
protobufs, encoded by hand below, with keys / values frames that fit them; a few structured-mode
inputs. fuzz_codecs: a valid payload per codec (decode mode) and a round trip per codec, laid
out the way FuzzedDataProvider reads them (integers from the end, bytes from the front).
fuzz_spec: the specs in experiments/specs/ plus a few small ones. fuzz_<plane>_plane: a few headers
of each plane.
"""
import os
import random
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- protobuf wire format, enough for wire::Header -------------------------------------------
def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3) + varint(v) if v else b""


def field_bytes(num, b):
    return varint((num << 3) | 2) + varint(len(b)) + b


def field_float(num, f):
    return varint((num << 3) | 5) + struct.pack("<f", f)


def field_double(num, d):
    return varint((num << 3) | 1) + struct.pack("<d", d)


def segment(offset, length):
    return field_varint(1, offset) + field_varint(2, length)


# wire.Type / wire.Role values (common/proto/gradsync.proto)
REGISTER, HEARTBEAT, INIT, PUSH, PULL, PULL_REPLY, ERROR, REPLICATE = 1, 5, 10, 12, 14, 15, 20, 30
WORKER = 3


PS_TYPES = (INIT, PUSH, PULL, PULL_REPLY)
PS_PLANE, CONTROL_PLANE, REPLICA_PLANE = 120, 121, 122  # Header.plane


def header(type_, rank=0, request_id=0, clock=0, version=0, segments=(), num_keys=0, has_values=False,
           codec="", ps=b"", control=b"", replica=b"", extra=b""):
    """A wire.Header: the envelope, the frames' fields, and the type's plane (its PsFields get
    clock, version and `ps`; ControlFields `control`; ReplicaFields `replica`)."""
    h = field_varint(1, type_) + field_varint(2, WORKER) + field_varint(3, rank) + field_varint(4, request_id)
    for off, length in segments:
        h += field_bytes(7, segment(off, length))
    h += field_varint(8, num_keys) + field_varint(9, 1 if has_values else 0)
    if codec:
        h += field_bytes(24, codec.encode())
    if type_ in PS_TYPES or ps:
        h += field_bytes(PS_PLANE, field_varint(1, clock) + field_varint(2, version) + ps)
    if control:
        h += field_bytes(CONTROL_PLANE, control)
    if replica:
        h += field_bytes(REPLICA_PLANE, replica)
    return h + extra


def raw_input(frames, router=True):
    """fuzz_message raw mode: byte 0 (bit 0 = ROUTER), byte 1 = frames - 1, 2-byte lengths."""
    assert 1 <= len(frames) <= 4
    out = bytearray([1 if router else 0, len(frames) - 1])
    for f in frames[:-1]:
        out += struct.pack("<H", len(f))
        out += f
    out += frames[-1]
    return bytes(out)


def floats(values):
    return b"".join(struct.pack("<f", v) for v in values)


def keys(ks):
    return b"".join(struct.pack("<Q", k) for k in ks)


def fp16(values):
    return b"".join(struct.pack("<e", v) for v in values)


def message_corpus(rng):
    # The fixture model: 3100 parameters, dense [0, 1000), sparse [1000, 3048), dense [3048, 3100);
    # shard 0 = [0, 1548), shard 1 = [1548, 3100) (request_id bit 0); bit 1 = bsp (aggregating).
    g = [rng.uniform(-1, 1) for _ in range(102)]
    write("fuzz_message", "push_dense_keys", raw_input([
        header(PUSH, rank=1, request_id=0, segments=[(0, 100)], num_keys=2, has_values=True),
        keys([1000, 1007]), floats(g)]))
    write("fuzz_message", "push_bsp_shard1", raw_input([
        header(PUSH, rank=2, request_id=3, segments=[(3048, 52)], has_values=True), floats(g[:52])]))
    write("fuzz_message", "pull_segments_keys", raw_input([
        header(PULL, rank=0, request_id=1, segments=[(3048, 10), (3060, 5)], num_keys=3),
        keys([1600, 1601, 2000])]))
    write("fuzz_message", "pull_pair", raw_input([header(PULL, rank=3, segments=[(10, 20)])], router=False))
    write("fuzz_message", "push_fp16", raw_input([
        header(PUSH, rank=0, segments=[(0, 64)], has_values=True, codec="fp16"), fp16(g[:64])]))
    # top-k 1% of 100 elements: k = 1, payload = k, index, value
    write("fuzz_message", "push_topk", raw_input([
        header(PUSH, rank=0, segments=[(100, 100)], has_values=True, codec="topk:0.01"),
        struct.pack("<I", 1) + struct.pack("<I", 42) + struct.pack("<f", 0.5)]))
    write("fuzz_message", "push_own_lr", raw_input([
        header(PUSH, rank=1, segments=[(0, 100)], has_values=True, ps=field_float(9, 0.01)), floats(g[:100])]))
    job = field_bytes(1, field_bytes(1, b"w") + field_varint(3, 3100))  # tensors
    job += field_varint(2, 3100) + field_varint(3, 4) + field_float(4, 0.1) + field_bytes(5, b"cosine")
    job += field_float(7, 0.9) + field_bytes(10, b"topk:0.01") + field_varint(11, 11) + field_varint(12, 1)
    write("fuzz_message", "init", raw_input([
        header(INIT, rank=0, segments=[(0, 16)], has_values=True, ps=field_bytes(3, job)),
        floats(g[:16])]))
    adam = field_bytes(1, field_bytes(1, b"w") + field_varint(3, 3100)) + field_varint(2, 3100) + field_varint(3, 4)
    adam += field_float(4, 0.001) + field_bytes(5, b"constant") + field_bytes(16, b"adam")
    adam += field_double(17, 0.9) + field_double(18, 0.999) + field_double(19, 1e-8)
    write("fuzz_message", "init_adam", raw_input([
        header(INIT, rank=0, segments=[(0, 16)], has_values=True, ps=field_bytes(3, adam)), floats(g[:16])]))
    node = field_varint(1, WORKER) + field_varint(2, (1 << 64) - 1) + field_bytes(4, b"127.0.0.1")
    write("fuzz_message", "register", raw_input([
        header(REGISTER, control=field_bytes(1, node) + field_bytes(5, b"ssp") + field_varint(6, 3))]))
    write("fuzz_message", "heartbeat", raw_input([header(HEARTBEAT)]))
    write("fuzz_message", "error_reply", raw_input([
        header(ERROR, extra=field_varint(20, 3) + field_bytes(21, b"bad"))], router=False))
    write("fuzz_message", "bad_frames", raw_input([header(PUSH, num_keys=1), b"", b"x"]))
    # Replication entries to a backup (fuzz_message.cc, CheckReplicate): a snapshot's META with the
    # job's key but a meta that is not a checkpoint, and a snapshot's parameters for shard 1.
    server = field_varint(2, 2)  # sender_role SERVER (the last value of a field wins)
    write("fuzz_message", "replicate_meta", raw_input([
        header(REPLICATE, rank=1, request_id=1, extra=server,
               replica=field_varint(1, 1) + field_varint(2, 1) + field_bytes(7, b"\x08\x01") +
               field_bytes(11, b"fuzz-replica-key"))]))
    write("fuzz_message", "replicate_params", raw_input([
        header(REPLICATE, rank=1, request_id=2, segments=[(1548, 1552)], has_values=True,
               extra=server, replica=field_varint(1, 1) + field_varint(2, 2) + field_varint(12, 1)),
        floats([0.25] * 1552)]))
    # Structured mode: the harness builds the header from FuzzedDataProvider reads, in the order
    # of StructuredFrames in fuzz_message.cc.
    for name, args in (
            ("structured_push", dict(type_=PUSH, rank=1, request_id=2, segments=[(0, 50)], keys=[1000, 1001, 1003],
                                     values=floats(g[:53]))),
            ("structured_pull", dict(type_=PULL, rank=2, request_id=1, segments=[(3048, 20)], keys=[1600, 1602])),
            ("structured_topk", dict(type_=PUSH, rank=0, segments=[(0, 200)], codec=6, encoded=200)),
            ("structured_heartbeat", dict(type_=HEARTBEAT, router=False))):
        write("fuzz_message", name, structured(**args))


MESSAGE_CODECS = ["", "fp16", "int8", "qsgd:4", "qsgd:16", "sign", "topk:0.01", "randomk:0.01", "bogus"]


def structured(type_, rank=0, request_id=0, segments=(), keys=(), values=None, codec=0, encoded=0, router=True):
    """fuzz_message structured mode: small clocks and versions (0), frames that fit."""
    f = Fdp()
    f.integral(0, 22, type_)
    f.integral(0, 7, 0 if type_ in PS_TYPES else 3)  # the plane: the type's own (PS), or none
    f.integral(0, 3, WORKER)
    f.integral(-1, 4, rank)
    f.integral(0, (1 << 64) - 1, request_id)
    for _ in ("clock", "version"):
        f.boolean(False)
        f.integral(-1, 3, 0)
    f.integral(0, 4, len(segments))
    for off, length in segments:
        for v in (off, length):
            f.boolean(False)
            f.integral(0, 3108, v)
    f.integral(0, 3, 2)  # a small count
    f.integral(0, 16, len(keys))
    has_values = values is not None or encoded > 0
    f.boolean(has_values)
    f.integral(0, len(MESSAGE_CODECS) - 1, codec)
    f.integral(0, 3, 1)      # no value channel
    if type_ != INIT:
        f.integral(0, 7, 1)  # no job
    f.integral(0, 7, 1)      # fit
    if keys:
        f.boolean(True)      # sorted: each key is the last + 1 + a step
        f.integral(0, 3100, keys[0])
        for a, b in zip(keys, list(keys[1:]) + [keys[-1] + 1]):
            f.integral(0, 64, b - a - 1)
    if has_values and codec:
        f.boolean(True)      # a real payload of the codec, from `encoded` floats in [-4, 4]
        for _ in range(encoded):
            f.integral(0, (1 << 32) - 1, rng_float_bits())
    elif has_values:
        f.front += values
    f.integral(0, 15, 2)     # no frame dropped or added
    return bytes([2 | (1 if router else 0)]) + f.data()


_float_rng = random.Random(5)


def rng_float_bits():
    return _float_rng.randrange(1 << 32)


# --- FuzzedDataProvider layout --------------------------------------------------------------
class Fdp:
    """Builds an input for FuzzedDataProvider: integers are read from the end, bytes from the front."""

    def __init__(self):
        self.front = bytearray()
        self.back = bytearray()  # in consumption order

    def integral(self, lo, hi, v):
        rng = hi - lo
        r = v - lo
        n = 0
        while n < 8 and (rng >> (8 * n)) > 0:
            n += 1
        self.back += r.to_bytes(n, "big") if n else b""

    def boolean(self, b):
        self.integral(0, 255, 1 if b else 0)

    def data(self):
        return bytes(self.front) + bytes(reversed(self.back))


CODECS = ["fp16", "int8", "qsgd:4", "qsgd:16", "sign", "topk:0.01", "randomk:0.01", "topk:0.5", "randomk:1"]


def kept(n, ratio):
    if n == 0:
        return 0
    return min(n, max(1, int(round(ratio * n))))


def payload(codec, n, rng):
    if codec == "fp16":
        return fp16([rng.uniform(-2, 2) for _ in range(n)])
    if codec in ("int8", "qsgd:4", "qsgd:16"):
        top = {"int8": 127, "qsgd:4": 4, "qsgd:16": 16}[codec]
        out = bytearray()
        for b in range(0, n, 512):
            out += struct.pack("<f", rng.uniform(0, 1))
            for _ in range(min(512, n - b)):
                level = rng.randrange(top + 1)
                if codec == "int8":
                    out.append((level if rng.random() < 0.5 else -level) & 0xFF)
                else:
                    out.append(level | (0x80 if rng.random() < 0.5 else 0))
        return bytes(out)
    if codec == "sign":
        bits = bytearray(rng.randrange(256) for _ in range((n + 7) // 8))
        if n % 8:
            bits[-1] &= (1 << (n % 8)) - 1
        return struct.pack("<f", 0.25) + bytes(bits)
    name, ratio = codec.split(":")
    k = kept(n, float(ratio))
    if name == "topk":
        idx = sorted(rng.sample(range(n), k))
        return struct.pack("<I", k) + b"".join(struct.pack("<I", i) for i in idx) + floats(
            [rng.uniform(-1, 1) for _ in range(k)])
    return floats([rng.uniform(-1, 1) for _ in range(k)])


def plane_corpus():
    """fuzz_<plane>_plane: byte 0 (bit 0: request or reply, entry or answer), then a header."""
    write("fuzz_ps_plane", "push", b"\x00" + header(PUSH, rank=1, request_id=4, clock=3, version=2,
                                                      segments=[(0, 100)], has_values=True,
                                                      ps=field_float(9, 0.01) + field_varint(7, 2) + field_varint(8, 1)))
    write("fuzz_ps_plane", "pull_lane", b"\x00" + header(PULL, rank=0, segments=[(10, 20)],
                                                           ps=field_bytes(11, field_varint(1, 1))))
    state = field_bytes(1, b"adam") + field_varint(2, 7) + field_varint(3, 2) + field_varint(4, 1)
    write("fuzz_ps_plane", "state_push", b"\x00" + header(25, segments=[(0, 8)], has_values=True,
                                                            ps=field_bytes(12, state)))
    reply = field_varint(1, 15) + field_varint(2, 2) + field_varint(4, 9) + field_bytes(7, segment(0, 16))
    reply += field_bytes(PS_PLANE, field_varint(1, 3) + field_varint(2, 40) + field_double(5, 1.5) + field_varint(6, 1))
    write("fuzz_ps_plane", "pull_reply", b"\x01" + reply)
    write("fuzz_ps_plane", "error_reply", b"\x01" + field_varint(1, ERROR) + field_varint(20, 5) + field_bytes(21, b"no"))
    node = field_varint(1, WORKER) + field_varint(3, 1) + field_bytes(4, b"127.0.0.1")
    write("fuzz_control_plane", "register", b"\x00" + header(REGISTER, control=field_bytes(1, node) + field_bytes(5, b"ssp") +
                                                             field_varint(6, 3) + field_bytes(7, b"fp")))
    write("fuzz_control_plane", "training_ended", b"\x00" + header(43, control=field_varint(15, 12) + field_varint(16, 1)))
    write("fuzz_control_plane", "barrier", b"\x00" + header(3, control=field_bytes(3, b"init") + field_bytes(4, b"workers") +
                                                            field_bytes(10, b"mine")))
    server = field_varint(2, 2)
    write("fuzz_replica_plane", "meta", b"\x00" + header(REPLICATE, rank=1, request_id=1, extra=server,
                                                          replica=field_varint(1, 1) + field_varint(2, 1) +
                                                          field_bytes(7, b"\x08\x01") + field_bytes(11, b"key")))
    push = field_varint(1, 1) + field_varint(2, 4) + field_varint(3, 2) + field_float(4, 0.5) + field_varint(5, 1)
    push += field_bytes(8, varint(3) + varint(2)) + field_bytes(9, b"\x01\x01") + field_varint(10, 1)
    write("fuzz_replica_plane", "push", b"\x00" + header(REPLICATE, rank=1, request_id=2, segments=[(1548, 4)],
                                                          has_values=True, extra=server, replica=push))
    write("fuzz_replica_plane", "ack", b"\x01" + field_varint(1, 31) + field_varint(2, 2) + field_varint(4, 2) +
          field_bytes(REPLICA_PLANE, field_varint(1, 1)))


def codecs_corpus(rng):
    for which, codec in enumerate(CODECS):
        for n in (0, 7, 600):
            f = Fdp()
            f.integral(0, len(CODECS) - 1, which)
            f.boolean(False)                # decode mode
            f.integral(0, 3, 0)             # n as given
            f.integral(0, 1 << 16, n)
            f.integral(0, (1 << 64) - 1, 5)  # step
            f.front += payload(codec, n, rng)
            write("fuzz_codecs", "decode_%s_%d" % (codec.replace(":", "_"), n), f.data())
        f = Fdp()
        f.integral(0, len(CODECS) - 1, which)
        f.boolean(True)                     # round trip
        f.integral(0, (1 << 64) - 1, 3)
        f.boolean(True)                     # sane magnitudes
        f.front += floats([rng.gauss(0, 1) for _ in range(300)])
        write("fuzz_codecs", "roundtrip_%s" % codec.replace(":", "_"), f.data())
    # Regressions (bugs fuzz_codecs found, fixed): non-finite and tiny values through Encode.
    nan, inf = float("nan"), float("inf")
    for codec, values in (("int8", [nan, 1.0, -inf, 2.0, 1e-38, -5e-39] + [0.5] * 600),
                          ("topk:0.5", [1.0, nan, -3.0, nan, 0.5, -inf, 4.0, 0.0] * 10),
                          ("int8", [1e-38, -5e-39, 0.0, 2.5e-39])):
        f = Fdp()
        f.integral(0, len(CODECS) - 1, CODECS.index(codec))
        f.boolean(True)
        f.integral(0, (1 << 64) - 1, 1)
        f.boolean(False)                    # values as they are
        f.front += floats(values)
        write("fuzz_codecs", "regress_%s_%d" % (codec.replace(":", "_"), len(values)), f.data())


def spec_corpus():
    specs = os.path.join(ROOT, "experiments", "specs")
    for name in sorted(os.listdir(specs)):
        if name.endswith(".textproto"):
            shutil.copy(os.path.join(specs, name), os.path.join(CORPUS, "fuzz_spec", name))
    write("fuzz_spec", "minimal", b'name: "m" run { name: "a" train { mode: ASP } }\n')
    write("fuzz_spec", "every_field", b'''name: "all" description: "d" target_accuracy: 0.5
defaults { workers: 3 servers: 2 timeout_s: 60
  train { model: "mlp" dataset: "blobs" epochs: 2 batch: 8 max_steps: 10 lr: 0.05
    lr_schedule: "cosine" momentum: 0.9 seed: 4 eval_every: 5 threads: 1 log_every: 5 } }
run { name: "s" train { mode: SSP staleness: 2 hidden: "64,32" compress: "qsgd:4" compress_pull: true overlap: false push_part_mib: 0.5
    staleness_aware_lr: true request_timeout: 30 recovery_timeout: 5 }
  straggler { worker: 1 fixed_ms: 3 } straggler { worker: 2 uniform { low_ms: 1 high_ms: 2 } }
  link { rate: "100mbit" delay_ms: 2 } }
run { name: "r" train { mode: ALLREDUCE compress: "randomk:0.1" momentum_correction: true bucket_mib: 4
    first_bucket_mib: 0.5 collective_timeout: 30 accumulate: 2 lr_scaling: "linear" base_batch: 16 warmup_epochs: 1 }
  straggler { worker: 0 exp_mean_ms: 1 seed: 9 } straggler { worker: 2 multiple: 2 } }
run { name: "p" train { mode: BSP model: "sparse_logreg" dataset: "sparse-logistic" feature_bits: 12 weight_decay: 0.001 nesterov: true } }
run { name: "a" train { mode: ASP optimizer: "adam" momentum: 0 adam_beta1: 0.8 adam_beta2: 0.99 adam_eps: 1e-6 } }
''')
    write("fuzz_spec", "errors", b'name: "e" run { name: "x" train { mode: SSP staleness: 1 model: "sparse_logreg" dataset: "blobs" lr: 0 } }\n')
    # Regression (fixed): a long hidden list overflowed the stack inside std::regex.
    write("fuzz_spec", "regress_long_hidden", b'name: "x" run { name: "a" train { mode: ASP hidden: "' + b"1," * 8000 + b'1" } }\n')


def main():
    rng = random.Random(20240601)
    # Everything but the inputs that once crashed a target (regress_*), which no code here writes.
    for d, _, files in os.walk(CORPUS):
        for f in files:
            if not f.startswith("regress_"):
                os.remove(os.path.join(d, f))
    os.makedirs(os.path.join(CORPUS, "fuzz_spec"), exist_ok=True)
    message_corpus(rng)
    plane_corpus()
    codecs_corpus(rng)
    spec_corpus()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(CORPUS) for f in fs)
    print("fuzz/corpus: %d bytes" % total)


if __name__ == "__main__":
    main()
