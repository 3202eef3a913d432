"""What a port scanner or a misdirected client sends to a job's ports (standard library only).

    # every payload to every target, one JSON line each
    python tests/scripts/foreign.py HOST:PORT ...

Used in-process by ``tests/e2e/test_foreign_packets.py`` (local job) and, run on a fourth
testbed host, by ``tests/cluster/test_foreign_host.py``.
"""
from __future__ import annotations

import json
import random
import socket
import ssl
import sys
import time


def client_hello() -> bytes:
    """A real TLS ClientHello, as Python's ssl module sends it first."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


# The first three are cut short: ZeroMQ waits for the rest and ps-lite never sees a message
# (measured). A ClientHello's random bytes decide how ZeroMQ frames it. 4 KiB of random bytes
# always contain a frame ps-lite cannot parse.
HARMLESS = {
    "short HTTP request": b"GET / HTTP/1.0\r\n\r\n",
    "truncated ZMTP greeting": b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x03",
    "truncated frame": b"\x00\xff" + b"x" * 10,
}
RANDOM = random.Random(28).randbytes(4096)


def payloads() -> dict[str, bytes]:
    """Every kind, the harmless ones first."""
    return {**HARMLESS, "TLS ClientHello": client_hello(), "4 KiB random": RANDOM}


def send(host: str, port: int, data: bytes, timeout: float = 3.0) -> str:
    """One connection that sends ``data``: ``"sent"``, or why not (``"refused"``, ...)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(data)
            time.sleep(0.05)
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:
        return "reset"
    except OSError as e:
        return f"error: {e.strerror or e}"
    return "sent"


def main(argv: list[str]) -> int:
    for target in argv:
        host, _, port = target.rpartition(":")
        for kind, data in payloads().items():
            print(json.dumps({"target": target, "payload": kind,
                              "result": send(host, int(port), data)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
