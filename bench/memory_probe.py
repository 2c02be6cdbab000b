#!/usr/bin/env python3
"""What strangers can make a shard hold: peak RSS (VmHWM) of a gradsync-server shard, on loopback.

Starts a scheduler and one shard (a job of one server and one worker that never comes, so the
shard sits with its data socket bound, as it does before and between jobs' workers), then:
  clean    nothing connects; the peak after --hold seconds
  big      3 plain TCP connections speak ZMTP 3.0 (greeting, READY) and each announce a 1 GiB
           frame, send up to --send-mib of it and stay open for --hold seconds
  churn    --connections connections come and go, each sending one malformed message
Each row is a fresh shard. Prints a Markdown table.

  /usr/bin/python3 bench/memory_probe.py [--build build] [--connections 100000]
"""
import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

GREETING = bytes([0xFF] + [0] * 8 + [0x7F, 3, 0]) + b"NULL" + bytes(16) + bytes(32)
READY_BODY = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
READY = bytes([0x04, len(READY_BODY)]) + READY_BODY


def zmtp_connect(port):
    """A ZMTP peer: our greeting, theirs (and their READY), then our READY; None if refused."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(GREETING)
    got = b""
    while len(got) < 66 or len(got) < 66 + got[65]:
        d = s.recv(256)
        if not d:
            s.close()
            return None
        got += d
    s.sendall(READY)
    return s


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def start_shard(build, tmp):
    bin_ = os.path.join(build, "bin", "gradsync-server")
    port_file = os.path.join(tmp, "sched.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    sched = subprocess.Popen([bin_, "--role=scheduler", "--num-servers=1", "--num-workers=1",
                              "--port-file=" + port_file, "--register-timeout=600"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(port_file):
            break
        time.sleep(0.05)
    sport = int(open(port_file).read())
    with socket.socket() as probe:  # a free port for the shard
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    shard = subprocess.Popen([bin_, "--role=server", "--mode=bsp", f"--scheduler=127.0.0.1:{sport}",
                              f"--port={port}", "--heartbeat-timeout=600"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):  # wait until it listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    time.sleep(0.5)
    return sched, shard, port


def stop(*procs):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_big(port, send_mib, hold):
    conns, sent = [], 0
    chunk = b"x" * (1 << 20)
    for _ in range(3):
        s = zmtp_connect(port)
        if s is None:
            continue
        s.settimeout(2)
        try:
            s.sendall(b"\x02" + struct.pack(">Q", 1 << 30))  # a long final frame of 1 GiB
            for _ in range(send_mib):
                sent += s.send(chunk)
        except OSError:
            pass  # the shard hung up: the frame is over its limit
        conns.append(s)
    time.sleep(hold)
    for s in conns:
        s.close()
    return f"3 connections, {sent / 2**20:.0f} MiB of 1 GiB frames sent"


def run_churn(port, n):
    opened = failed = 0
    for _ in range(n):
        try:
            s = zmtp_connect(port)
        except OSError:
            failed += 1
            continue
        if s is None:
            failed += 1
            continue
        try:
            s.sendall(b"\x00\x01\x7f")  # one malformed message: a new identity the shard reads
        except OSError:
            pass
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT
        s.close()
        opened += 1
    time.sleep(1)
    return f"{opened} connections came and went ({failed} failed)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--connections", type=int, default=100000)
    ap.add_argument("--send-mib", type=int, default=1023, help="MiB of each 1 GiB frame sent (at most)")
    ap.add_argument("--hold", type=float, default=3.0)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("clean", "big", "churn"):
            sched, shard, port = start_shard(a.build, tmp)
            start = time.time()
            try:
                if name == "clean":
                    time.sleep(a.hold)
                    what = "nothing connects"
                elif name == "big":
                    what = run_big(port, a.send_mib, a.hold)
                else:
                    what = run_churn(port, a.connections)
                alive = shard.poll() is None
                rows.append((name, what, status_kib(shard.pid, "VmHWM") / 1024, status_kib(shard.pid, "VmRSS") / 1024,
                             alive, time.time() - start))
            finally:
                stop(shard, sched)
    print("| run | what | peak RSS (MiB) | RSS after (MiB) | shard alive | seconds |")
    print("|---|---|---|---|---|---|")
    for name, what, hwm, rss, alive, secs in rows:
        print(f"| {name} | {what} | {hwm:.1f} | {rss:.1f} | {'yes' if alive else 'no'} | {secs:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
