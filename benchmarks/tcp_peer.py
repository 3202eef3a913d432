"""Raw loopback TCP echo peer: the baseline of the push/pull bandwidth benchmark.

``python -m benchmarks.tcp_peer NBYTES`` listens on 127.0.0.1 (a free port, printed as the first
line of stdout), accepts one connection, then repeatedly receives exactly ``NBYTES`` into a
preallocated buffer and sends them back, until the client closes. One round trip of the client
moves ``2 · NBYTES`` bytes, out then back, as a worker's push then pull of the same parameters.

Plain Python sockets with ``recv_into``/``sendall`` on one preallocated buffer: every byte is
copied by the kernel only (no Python-level copies), which is what a well-written transport can
reach on this machine.
"""
from __future__ import annotations

import socket
import sys


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fills ``view`` from ``sock``; ``False`` if the peer closed first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    nbytes = int(args[0])
    buf = memoryview(bytearray(nbytes))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        print(srv.getsockname()[1], flush=True)
        conn, _ = srv.accept()
        with conn:
            while recv_exact(conn, buf):
                conn.sendall(buf)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
