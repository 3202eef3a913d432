"""The ssh backend: dmlc_tracker's ``ssh`` starts one ssh client per process,
round-robin over the hostfile's lines (servers first).

One client per process is what lets this backend name a failed process exactly: its
guard's lines and its own ps-lite Bind line come back through its own client. ``ssh``
runs with ``-tt`` (sshd signals a command only through its terminal: without one, the
remote processes of a failed job would outlive their killed clients) and a keepalive (a
silent host is given up after 3 x 3 s, then the probe names it). ssh's status 255 means
both "could not connect" and "the remote process died of a signal"; the guard's lines
tell which.

Hosts must be IP addresses: dmlc exports each line's host as ``DMLC_NODE_HOST``, which
ps-lite hands to ZeroMQ's bind, and that bind does not resolve names. An elastic job
probes every host with ``ssh host true`` before a restart (:func:`ssh_probe`) and runs
the attempt from a hostfile of the answering hosts only (:func:`survivors_hostfile`).
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Collection, Mapping, Sequence

from mxlarge.launcher.backends.dmlc import DmlcBackend
from mxlarge.launcher.backends.dmlc_job import Launched, Tool
from mxlarge.launcher.child import Child, exit_code_for
from mxlarge.launcher.environment import SHELL_SAFE
from mxlarge.launcher.explain import FailureContext, status_words, who
from mxlarge.launcher.hostfile import (
    HostEntry,
    check_server_hosts,
    hostfile_text,
    is_ip,
    listed_hosts,
    place,
    with_server_hosts,
)
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.reach import ssh_silent, unreachable
from mxlarge.launcher.restart import Elastic, Probe
from mxlarge.plan import World

_SSH_TARGET = re.compile(r"^ssh .*?StrictHostKeyChecking=no (\S+) -p (\S+)")
# ssh: the client gives up on a silent server after 3 x 3 s (a partitioned host; the probe then
# names it), instead of waiting for TCP's own timeout (minutes to hours).
_SSH_FLAGS = "ssh -tt -o ServerAliveInterval=3 -o ServerAliveCountMax=3 "


def ssh_probe(ports: Mapping[str, int]) -> Probe:
    """An ssh job's :data:`~mxlarge.launcher.restart.Probe`: the hosts (``{host: ssh
    port}``) that let ``ssh host true`` through within
    :data:`~mxlarge.launcher.reach.SSH_PROBE_TIMEOUT` s, all probed at once."""
    def probe(hosts: Sequence[str]) -> list[str]:
        silent = ssh_silent({h: ports.get(h, 22) for h in dict.fromkeys(hosts)})
        return [h for h in hosts if h not in silent]
    return probe


def ssh_slots(lines: Sequence[HostEntry], servers: int, workers: int
              ) -> tuple[list[HostEntry], list[HostEntry]]:
    """Where dmlc's ssh backend puts a job: process i (servers first, then workers) on
    line i mod L of the hostfile's L lines. Returns (each server's line, each worker's
    line)."""
    n = len(lines)
    return ([lines[i % n] for i in range(servers)],
            [lines[(servers + i) % n] for i in range(workers)])


def survivors_hostfile(server_lines: Sequence[HostEntry], worker_lines: Sequence[HostEntry],
                       answering: Collection[str], servers: int, workers: int) -> str:
    """The hostfile of an attempt with ``servers`` servers and ``workers`` workers on
    the ``answering`` hosts only, as :func:`ssh_slots` lines of the declared job: one
    line per process, the servers' first, so that dmlc puts process i on line i. The
    workers take the first ``workers`` declared worker lines whose host answers (in
    order); the servers go round-robin over the declared server lines that answer, or
    over the workers' if none does.

    Raises:
        ValueError: fewer answering worker lines than ``workers`` (the world does not fit).
    """
    live = [e for e in worker_lines if e.host in answering]
    if len(live) < workers:
        raise ValueError(f"{workers} worker(s) but {len(live)} answering worker line(s)")
    homes = [e for e in server_lines if e.host in answering] or live[:workers]
    chosen = [homes[i % len(homes)] for i in range(servers)] + live[:workers]
    return hostfile_text(chosen)


class SshBackend(DmlcBackend):
    """``--launcher ssh``."""

    name = "ssh"
    tool = Tool("ssh")

    def check_hosts(self, hostfile: str | None, workers: int, servers: int,
                    server_hosts: Sequence[str] = ()) -> list[HostEntry]:
        """The hostfile's lines; with server hosts, one line per process as dmlc reads
        them (each server's, then each worker's:
        :func:`~mxlarge.launcher.hostfile.place`), so that dmlc's line i mod L is
        process i's own host."""
        entries = with_server_hosts(listed_hosts(hostfile, self.name, colon="port"),
                                    server_hosts, str(hostfile))
        # dmlc exports each line's host as DMLC_NODE_HOST, and ps-lite hands that to
        # ZeroMQ's bind, which takes addresses and interface names but does no DNS
        # ("bind failed").
        named = [e.host for e in entries if not is_ip(e.host)]
        if named:
            raise ValueError(
                f"hostfile {hostfile}: the ssh launcher needs IP addresses, not names "
                f"({', '.join(sorted(set(named)))}): dmlc passes each host to ps-lite as "
                f"DMLC_NODE_HOST, the address it binds, and that bind does not resolve names")
        homes = check_server_hosts(entries, servers, str(hostfile))
        # dmlc places servers round-robin from the first line, then workers after them:
        # with at least as many lines as workers, each worker gets a line of its own.
        lines = [e for e in entries if not e.server]
        if len(lines) < workers:
            raise ValueError(
                f"hostfile {hostfile} lists {len(lines)} {'worker ' if homes else ''}host(s) "
                f"but {workers} workers need at least {workers} lines (repeat a line to put "
                f"several workers on one host)")
        if not homes:
            return entries
        server_lines, worker_lines = place(entries, servers, workers)
        return server_lines + worker_lines

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        if local_lost is not None:
            raise ValueError("--local-lost: expected with --launcher local (an ssh job probes "
                             "its hosts with ssh)")
        assert lines is not None
        server_lines, worker_lines = ssh_slots(lines, servers, world.processes)
        ports = {e.host: int(e.port) for e in lines if e.port}
        return Elastic(world, [e.host for e in worker_lines], ssh_probe(ports), min_workers,
                       others=[e.host for e in server_lines])

    def attempt_hostfile(self, lines: list[HostEntry] | None, elastic: Elastic,
                         declared_servers: int, servers: int, workers: int) -> str | None:
        if lines is None or not elastic.lost:
            return None
        # the answering hosts only, servers re-placed there
        return survivors_hostfile(*ssh_slots(lines, declared_servers,
                                             elastic.declared.processes),
                                  elastic.answering, servers, workers)

    def check_words(self, words: Sequence[str]) -> None:
        bad = next((w for w in words if "'" in w), None)
        if bad is not None:
            raise ValueError(f"the ssh backend wraps the remote command in single quotes; "
                             f"{bad!r} contains one")
        cwd = os.getcwd()
        if not SHELL_SAFE.match(cwd):
            raise ValueError(f"the ssh backend runs 'cd {cwd}' unquoted on each host; run from "
                             f"a directory whose path has no spaces or shell metacharacters")

    def prepare(self, hostfile: str | None, entries: list[HostEntry] | None,
                stack: contextlib.ExitStack) -> tuple[str | None, list[str]]:
        # dmlc's ssh backend does not know comments; give it a clean copy.
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mxlarge-hosts-"))
        path = os.path.join(tmp, "hosts")
        with open(path, "w", encoding="utf-8") as f:
            f.write(hostfile_text(entries or ()))
        return path, [e.host for e in entries or ()]

    def describe(self, role: str, number: int, command: str) -> Launched:
        target = _SSH_TARGET.match(command)
        where = f" via ssh {target.group(1)}:{target.group(2)}" if target else " via ssh"
        # one process per client: labelled by its kvstore rank once ps-lite assigned it
        return Launched(role, number, None, target.group(1) if target else None, where)

    def fix_command(self, command: str) -> str:
        """``-tt`` and the keepalive (module docstring)."""
        if command.startswith("ssh "):
            return _SSH_FLAGS + command[len("ssh "):]
        return command

    def explain(self, context: FailureContext, child: Child) -> Outcome:
        assert child.status is not None
        host = context.targets.get(child.pid)
        rank = context.rank(child, host, child.guard.pid, by_bind=child.guard.pid is not None)
        what = who(child.role, rank, child.index, host)

        def failed(code: int, line: str, status: int) -> Outcome:
            return context.failed(code, line, child.role, rank, child.index, host, status,
                                  child, child.guard.pid)

        if child.guard.signal is not None:
            status = -child.guard.signal
            line = f"{what} {status_words(status)}"
            cause = child.pslog.cause()
            line = line if cause is None else f"{line}: {cause}"
            return failed(128 + child.guard.signal, line, status)
        if child.status != 255:  # the guard passed the command's own status on
            return failed(exit_code_for(child.status), f"{what} {status_words(child.status)}",
                          child.status)
        why = None if host is None else unreachable(host, context.ports.get(host, 22))
        if host is not None and why is not None:  # why is None without a host
            context.cut[host] = why
            return failed(255, f"{what}: host {host} unreachable ({why}); ssh lost it "
                               f"(status 255)", 255)
        if child.guard.pid is None:
            return failed(255, f"{what}: ssh exited with status 255 before the command "
                               f"started (ssh could not connect?)", 255)
        return failed(255, f"{what}: ssh exited with status 255 while the command ran and the "
                           f"host answers (the connection broke)", 255)

    def used_hosts(self, hosts: list[str], contacted: set[str]) -> list[str]:
        # in hostfile order (dmlc's threads start the clients in any order)
        return [h for h in hosts if h in contacted]
