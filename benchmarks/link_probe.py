"""One bounded TCP transfer between two testbed hosts: what the shaped link itself delivers.

    python -m benchmarks.link_probe serve ADDR PORT        # on the receiving host
    python -m benchmarks.link_probe send ADDR PORT MBYTES  # on the sending host

The receiver reads until the sender closes, then answers with the byte count; the sender
prints ``seconds`` from its first byte to that answer (so the bytes are received, not buffered).
"""
from __future__ import annotations

import socket
import sys
import time

CHUNK = 1 << 20


def serve(addr: str, port: int) -> None:
    with socket.create_server((addr, port)) as srv:
        print("ready", flush=True)
        conn, _ = srv.accept()
        with conn:
            total = 0
            buf = bytearray(CHUNK)
            while n := conn.recv_into(buf):
                total += n
            conn.sendall(str(total).encode())


def send(addr: str, port: int, mbytes: int) -> None:
    data = bytes(CHUNK)
    with socket.create_connection((addr, port)) as conn:
        t0 = time.perf_counter()
        for _ in range(mbytes):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        got = int(conn.recv(64).decode())
        seconds = time.perf_counter() - t0
    if got != mbytes * CHUNK:
        raise SystemExit(f"link_probe: sent {mbytes * CHUNK} bytes, receiver got {got}")
    print(f"{seconds:.6f}", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 3:
        serve(argv[1], int(argv[2]))
    elif argv[:1] == ["send"] and len(argv) == 4:
        send(argv[1], int(argv[2]), int(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
