"""One bounded TCP transfer, to measure a shaped link of the testbed.

    python -m benchmarks.link_rate server BIND_IP PORT    # prints "<Gbit/s> Gbit/s" at the end
    python -m benchmarks.link_rate client DEST_IP PORT MBYTES

The server accepts one connection and receives until the client closes; the rate is bytes × 8 ÷
seconds from the first received byte to the close.
"""
from __future__ import annotations

import socket
import sys
import time


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4) or args[0] not in ("server", "client"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    mode, ip, port = args[0], args[1], int(args[2])
    if mode == "server":
        with socket.socket() as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((ip, port))
            srv.listen(1)
            conn, _ = srv.accept()
            buf, n, t0 = bytearray(1 << 20), 0, None
            with conn:
                while k := conn.recv_into(buf):
                    t0 = t0 or time.perf_counter()
                    n += k
            seconds = time.perf_counter() - (t0 or time.perf_counter())
            print(f"{n * 8 / seconds / 1e9 if seconds else 0.0:.3f} Gbit/s", flush=True)
        return 0
    chunk = b"\0" * (1 << 20)
    with socket.create_connection((ip, port)) as c:
        for _ in range(int(args[3])):
            c.sendall(chunk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
