"""What the launcher reads in ps-lite's output (MXNet 1.9.1,
``3rdparty/ps-lite/src/van.cc``).

Two facts, both measured with real processes (``tests/e2e/test_foreign_packets.py``):

* With ``PS_VERBOSE=1`` every process logs, once it listens, ``van.cc:310: Bind to
  role=server, ip=127.0.0.1, port=41234, is_recovery=0``, plus a handful of other level-1
  lines at start and exit (ranks assigned, "is connected", barrier counts, "is stopping");
  level 1 logs no per-message line. The launchers turn it on where the user left
  ``PS_VERBOSE`` unset, keep the addresses and do not show those lines
  (:data:`VERBOSE_ENV`), so a failure can name the port of the process that failed.
* ps-lite listens with a ZeroMQ ROUTER socket that accepts any TCP client, and parses each
  message it receives with a ``CHECK``: a message that is not ps-lite's own protobuf ends the
  process at once, ``van.cc:520: Check failed: pb.ParseFromArray(meta_buf, buf_size): failed
  to parse string into protobuf``, then SIGABRT. Bytes that happen to parse as an empty meta
  fail the next check instead, ``van.cc:225: Check failed: msg->meta.sender != Meta::kEmpty``
  (a TLS ClientHello, about 1 in 20, measured). Nothing of the job sends either message, so
  such a line means something outside the job (a port scanner, a misdirected client)
  connected to that process's port. 4 KiB of random bytes do it; a short HTTP request or a
  truncated ZeroMQ greeting does not (ZeroMQ waits for the rest); a TLS ClientHello sometimes
  does, depending on its random bytes. Who sent it cannot be told afterwards: ps-lite logs no peer
  address, the connection ends with the process, and a host without the packet filter keeps
  no connection table (the line says so; with the filter, an outsider's connection is refused
  before any byte arrives).

Importing this module does not import MXNet.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Mapping

#: Set by the launchers for every process where the user left it unset (see
#: :class:`PsLog`).
VERBOSE_ENV = {"PS_VERBOSE": "1"}

_BIND = re.compile(r"van\.cc:\d+: Bind to role=\w+, (?:id=\d+, )?ip=(?P<ip>[^,\s]+), "
                   r"port=(?P<port>\d+)")
# ps-lite's level-1 lines (van.cc, zmq_van.h of MXNet 1.9.1), hidden when the launcher,
# not the user, asked for them.
_VERBOSE = re.compile(r"(?:van\.cc|zmq_van\.h):\d+: (?:Bind to |assign rank=|the scheduler is "
                      r"connected to |\S+ is connected to others|Barrier count for "
                      r"|\S+ is (?:stopping|stopped)$)")
# The scheduler's "assign rank=ID to node role=R, ip=I, port=P": ps-lite node ids are 8
# + 2r for server r and 9 + 2r for worker r (kvstore rank r), so this names every
# process's kvstore rank.
_ASSIGN = re.compile(r"van\.cc:\d+: assign rank=(?P<id>\d+) to node role=(?P<role>server|worker), "
                     r"ip=(?P<ip>[^,\s]+), port=(?P<port>\d+)")
_ABORT = re.compile(r"(?P<line>van\.cc:\d+): Check failed: (?:pb\.ParseFromArray\(meta_buf, "
                    r"buf_size\): (?P<why>failed to parse string into protobuf)|"
                    r"(?P<check>msg->meta\.sender != Meta::kEmpty))")


def verbose_env(environ: Mapping[str, str]) -> dict[str, str]:
    """:data:`VERBOSE_ENV` unless ``environ`` (what the processes get) sets ``PS_VERBOSE``."""
    return {} if "PS_VERBOSE" in environ else dict(VERBOSE_ENV)


class PsLog:
    """Reads one supervised process's output (or one ``mpirun``'s/``srun``'s, which
    carries several processes' lines) for :data:`_BIND` and :data:`_ABORT`.

    Args:
        hide_verbose: drop ps-lite's level-1 lines from the shown output (the launcher set
            ``PS_VERBOSE`` itself).
    """

    def __init__(self, hide_verbose: bool) -> None:
        self.hide_verbose = hide_verbose
        self.bound: list[str] = []   # "ip:port" of each Bind line, in order
        self.aborted: str | None = None  # the malformed-message check that fired: "van.cc:520: ..."
        # the scheduler's assignments: "ip:port" -> (role, kvstore rank)
        self.assigned: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def see(self, line: str) -> bool:
        """Record what ``line`` tells; return whether to show it."""
        m = _BIND.search(line)
        a = _ASSIGN.search(line)
        with self._lock:
            if m:
                self.bound.append(f"{m.group('ip')}:{m.group('port')}")
            if a:
                node = int(a.group("id"))
                self.assigned[f"{a.group('ip')}:{a.group('port')}"] = (
                    a.group("role"), (node - 8 - (a.group("role") == "worker")) // 2)
            b = _ABORT.search(line)
            if b and self.aborted is None:
                self.aborted = f"{b.group('line')}: {b.group('why') or b.group('check')}"
        return not (self.hide_verbose and _VERBOSE.search(line))

    def cause(self) -> str | None:
        """Why the process died, when its output says so; ``None`` otherwise."""
        with self._lock:
            if self.aborted is None:
                return None
            where = (f"its port {self.bound[0]}" if len(self.bound) == 1 else
                     f"one of its ports ({', '.join(self.bound)})" if self.bound else
                     "its port")
            check = self.aborted
        return (f"ps-lite aborted on a malformed message that arrived on {where} ({check}): "
                "something outside the job (a port "
                "scanner, a misdirected client) connected to it; its sender cannot be told "
                "here (ps-lite logs no peer, and the connection ended with the process); "
                "see 'Who can reach a job' in docs/security.md")
