"""One end of bench/link_latency.sh's TCP ping-pong: `serve HOST PORT COUNT SIZE` echoes COUNT
messages of SIZE bytes; `ping HOST PORT COUNT SIZE` sends them, waits for each echo and prints the
median and 10th percentile round trip in microseconds (the first tenth left out as warm-up). Both
ends poll a non-blocking socket instead of sleeping in recv, as the ring's ranks poll for their
peers (CollectiveOptions::mesh_wait): what is left is the link and the two kernels' TCP paths."""
import socket
import statistics
import sys
import time


def read_exactly(sock, size, deadline):
    got = bytearray()
    while len(got) < size:
        if time.monotonic() > deadline:
            raise SystemExit("link_latency.py: no answer within 10 s")
        try:
            part = sock.recv(size - len(got))
        except BlockingIOError:
            continue
        if not part:
            raise SystemExit("link_latency.py: the other end closed the connection")
        got += part
    return got


def main():
    role, host, port, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    if role == "serve":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(1)
        listener.settimeout(10)
        sock, _ = listener.accept()
    else:
        sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    message = b"x" * size
    rtts = []
    for _ in range(count):
        deadline = time.monotonic() + 10
        if role == "serve":
            echo = read_exactly(sock, size, deadline)
            sock.setblocking(True)
            sock.sendall(echo)
            sock.setblocking(False)
        else:
            start = time.perf_counter()
            sock.setblocking(True)
            sock.sendall(message)
            sock.setblocking(False)
            read_exactly(sock, size, deadline)
            rtts.append((time.perf_counter() - start) * 1e6)
    if role == "ping":
        rtts = sorted(rtts[count // 10:])
        print(f"{size} B: round trip median {statistics.median(rtts):.1f} us, 10th percentile {rtts[len(rtts) // 10]:.1f} us")


if __name__ == "__main__":
    main()
