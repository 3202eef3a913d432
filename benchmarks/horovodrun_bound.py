"""``horovodrun`` whose own listening sockets bind one address instead of 0.0.0.0.

    python -m benchmarks.horovodrun_bound [--bind ADDR] HOROVODRUN-OPTIONS... -- COMMAND...

Horovod 0.28.1's launcher opens its rendezvous HTTP server (and, for remote hosts, its driver
service) through ``find_port``, which binds ``('', port)``: every interface. Gloo's own traffic
follows ``--network-interface``. This wrapper replaces ``find_port`` in the two modules that
use it with the same random-port search bound to ``ADDR`` (default 127.0.0.1; on the testbed
the launching host's own address), then runs horovodrun with the options before ``--`` and
the command after it. (horovodrun's own parser would take a command option such as ``--net``
for an abbreviation of its ``--network-interface``, and keeps a ``--`` in the command.)
"""
from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any


def bound_find_port(host: str) -> Callable[[Callable[[tuple[str, int]], Any]], tuple[Any, int]]:
    """``horovod.runner.util.network.find_port`` with ``host`` in place of ``''``."""

    def find_port(server_factory: Callable[[tuple[str, int]], Any]) -> tuple[Any, int]:
        min_port, max_port = 1024, 65536
        start = random.randrange(0, max_port - min_port)
        for offset in range(max_port - min_port):
            port = min_port + (start + offset) % (max_port - min_port)
            try:
                return server_factory((host, port)), port
            except OSError:
                continue
        raise OSError(f"no free port to bind on {host}")

    return find_port


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    host = "127.0.0.1"
    if args[:1] == ["--bind"]:
        if len(args) < 2:
            print("horovodrun_bound: error: --bind needs an address", file=sys.stderr)
            return 2
        host, args = args[1], args[2:]
    if "--" not in args or args.index("--") == len(args) - 1:
        print("horovodrun_bound: error: expected HOROVODRUN-OPTIONS -- COMMAND",
              file=sys.stderr)
        return 2
    cut = args.index("--")
    from horovod.runner import launch
    from horovod.runner.common.util import network
    from horovod.runner.http import http_server

    http_server.find_port = network.find_port = bound_find_port(host)
    sys.argv = ["horovodrun", *args[:cut], "true"]  # a placeholder command for its parser
    parsed = launch.parse_args()
    parsed.command = args[cut + 1:]
    launch._run(parsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
