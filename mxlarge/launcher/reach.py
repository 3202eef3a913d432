"""Whether a job's hosts answer: what names a partitioned host in a failure or a stall.

:func:`unreachable` is a TCP connect to a host's ssh port with a short timeout: an
answer, even a refusal, means the host is up and reachable from here; silence or "no
route" means it is not. :func:`ssh_fails` asks more: that ``ssh host true`` succeeds
within a few seconds, which is what an ``--elastic`` ssh job asks of every host before a
restart (a host that answers a connect but cannot run the job's processes is no host for
it). Importing this module does not import MXNet.
"""
from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

PROBE_TIMEOUT = 2.0
SSH_PROBE_TIMEOUT = 5.0


def unreachable(host: str, port: int = 22, timeout: float = PROBE_TIMEOUT) -> str | None:
    """``None`` if ``host`` answers a TCP connect to ``port`` (accepted or refused)
    within ``timeout`` s, else why not, e.g. ``"no answer on port 22 within 2 s"``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return None  # refused: the host is up and answered
    except TimeoutError:
        return f"no answer on port {port} within {timeout:g} s"
    except OSError as e:
        return f"port {port}: {e.strerror or e}"


def unreachable_hosts(hosts: Mapping[str, int], timeout: float = PROBE_TIMEOUT
                      ) -> dict[str, str]:
    """:func:`unreachable` for every host at once (threads): ``{host: why}`` of those
    that did not answer; takes at most ``timeout`` s (+ thread start)."""
    return each_host(hosts, lambda host, port: unreachable(host, port, timeout), timeout)


def ssh_run(host: str, port: int, command: str, timeout: float
            ) -> subprocess.CompletedProcess[str] | str:
    """``ssh -p port host command`` (the ``ssh`` on PATH, non-interactive: no password
    prompt, no host-key question), or why it gave no exit status within ``timeout`` s.
    """
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
           "-o", f"ConnectTimeout={max(1, int(timeout))}", "-p", str(port), host, command]
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return str(e.strerror or e)


def ssh_fails(host: str, port: int = 22, timeout: float = SSH_PROBE_TIMEOUT) -> str | None:
    """``None`` if ``ssh -p port host true`` exits 0 within ``timeout`` s, else why not."""
    r = ssh_run(host, port, "true", timeout)
    if isinstance(r, str):
        return f"ssh {host} true: {r}"
    if r.returncode == 0:
        return None
    said = r.stderr.strip().splitlines()
    return f"ssh {host} true: status {r.returncode}" + (f" ({said[-1]})" if said else "")


def ssh_silent(hosts: Mapping[str, int], timeout: float = SSH_PROBE_TIMEOUT) -> dict[str, str]:
    """:func:`ssh_fails` for every host at once: ``{host: why}`` of those that did not
    let ``ssh host true`` through; takes at most ``timeout`` s (+ thread start)."""
    return each_host(hosts, lambda host, port: ssh_fails(host, port, timeout), timeout)


def each_host(hosts: Mapping[str, int], fails: Callable[[str, int], str | None],
          timeout: float) -> dict[str, str]:
    """``fails(host, port)`` for every host in threads of its own; ``{host: why}`` of
    the hosts it gave a reason for, or that had no verdict after ``timeout`` + 1 s."""
    found: dict[str, str] = {}
    lock = threading.Lock()

    def one(host: str, port: int) -> None:
        why = fails(host, port)
        if why is not None:
            with lock:
                found[host] = why

    threads = {host: threading.Thread(target=one, args=(host, port), daemon=True)
               for host, port in hosts.items()}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + timeout + 1
    for t in threads.values():
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        late = {h: f"no verdict within {timeout + 1:g} s" for h, t in threads.items()
                if t.is_alive() and h not in found}
        return {**found, **late}
