"""Progress reports from workers to their launcher: one small file per rank, no KVStore
traffic.

The launcher gives every process of a job the directory :data:`ENV`
(``MXLARGE_HEARTBEAT_DIR``); :func:`launched_dir` is its one reader, at a process's
root. A worker writes ``worker-<rank>.json`` there: a :class:`Record` padded to
:data:`SIZE` bytes and rewritten in place with one ``pwrite`` (a reader sees an old or a
new record, never a mix).

``done`` counts an update only once its result exists
(:meth:`HeartbeatWriter.completes`: a watcher thread waits for it), and the training
thread waits only when :data:`AHEAD` updates are unconfirmed. ``tick``, advanced by a
writer thread every :data:`INTERVAL`, tells a running process from a stopped one. Why,
and the costs measured: docs/design/session.md.
"""
from __future__ import annotations

import atexit
import contextlib
import enum
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

ENV = "MXLARGE_HEARTBEAT_DIR"
#: Updates a worker may have issued beyond the last one known complete; at more, the
#: training thread waits until at most half as many are unconfirmed.
AHEAD = 8
#: Seconds the watcher thread is given to end when the process exits.
STOP_TIMEOUT = 5.0
#: Seconds a failing worker gives its watcher to confirm the updates it handed over
#: (:meth:`HeartbeatWriter.settle`), so that its last record names the step it failed
#: at.
SETTLE = 2.0
#: Bytes of a record: room for the parts and a few hundred servers' ``[ms, share]``.
SIZE = 8192
INTERVAL = 1.0  # seconds between writes of one worker's record
# The phase of a worker whose work is done: every worker passed the store's last
# barrier, what is left is MXNet's shutdown (written at exit by
# mxlarge.protocol.session).
FINISHED = "finished"
#: The file in the heartbeat directory by which the launcher asks rank 0 to stop at its
#: next step (:func:`ask_stop`, :class:`~mxlarge.errors.StopRequested`).
STOP_FILE = "stop"


def ask_stop(directory: str | Path) -> None:
    """The launcher's side: rank 0 reads :data:`STOP_FILE` within :data:`INTERVAL` s and
    stops at its next step."""
    Path(directory, STOP_FILE).touch()


@dataclass(frozen=True)
class Record:
    """One worker's last report.

    Attributes:
        rank: kvstore rank.
        host: where the worker runs; pid: its process id there.
        done: updates known to be complete (the step counter of the next update to apply).
        issued: the last update this worker has issued (its gradients are on their way), -1
            before the first.
        here: updates completed by this process (0 until its first step is done: a
            restarted worker starts at a checkpoint's step).
        phase: ``train``, or what the worker says it is busy with (``evaluating``, ...), or
            :data:`FINISHED`.
        tick: the writer's counter, +1 per write.
        parts: the worker's step breakdown, None until it has one: the medians (ms) of its
            recent sampled steps (``data``: waiting for data, ``compute``: forward+backward
            between two engine syncs, ``exchange``: waiting for this step's exchange,
            ``update``, ``step``: the
            sampled step's wall time; :mod:`mxlarge.breakdown`), ``n``
            sampled steps in that window, and of the newest sampled step its number ``at``
            and the wall-clock time (``time.time()``) ``end`` its exchange ended; every rank
            samples the same step numbers (the launcher compares ranks at one step:
            :mod:`mxlarge.launcher.straggler`), and the oldest one's number ``from``.
        servers: per server (kvstore rank), ``[ms, share]``: the median time from the
            exchange's start until the sums it holds alone were there, over the sampled
            steps that waited for it first (-1 without one), and its share of the pushed
            bytes (:mod:`mxlarge.launcher.servers`); None without servers.
    """

    rank: int
    host: str
    pid: int
    done: int
    issued: int
    here: int
    phase: str
    tick: int
    parts: dict[str, float] | None = None
    servers: list[list[float]] | None = None

    def encode(self) -> bytes:
        data = json.dumps(asdict(self), separators=(",", ":")).encode()
        if len(data) >= SIZE:
            raise ValueError(f"heartbeat record longer than {SIZE} bytes: {data[:80]!r}...")
        return data.ljust(SIZE - 1) + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Record | None:
        """The record in ``data``, or ``None`` if it is empty or torn (read mid-write)."""
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None


class Result(Protocol):
    """What :meth:`HeartbeatWriter.completes` waits for (an ``mx.nd.NDArray`` the update writes)."""

    def wait_to_read(self) -> None: ...


_STOP = (-1, None)  # the watcher's last item


def path_for(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}.json"


class FromLauncher(enum.Enum):
    """The type of :data:`LAUNCHED`."""

    DIR = "the directory the launcher that started this process gave it, if any"


# mxlarge.Trainer's default ``heartbeat`` and ``reports``: resolved at construction by
# :func:`launched_dir` and :func:`mxlarge.protocol.reports.launched_reports`.
LAUNCHED = FromLauncher.DIR


def launched_dir() -> Path | None:
    """The heartbeat directory the launcher gave this process (:data:`ENV`), or ``None``
    when no launcher asked for heartbeats (a process not started by ``mxlarge launch``
    or ``python -m mxlarge.launcher``).

    The one reader of :data:`ENV`; call it at a process's root and pass the result down.
    """
    directory = os.environ.get(ENV)
    return Path(directory) if directory else None


def read_all(directory: str | Path) -> dict[int, Record]:
    """Every readable worker record in ``directory``, by rank."""
    out: dict[int, Record] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if not (entry.name.startswith("worker-") and entry.name.endswith(".json")):
                continue
            try:
                with open(entry.path, "rb") as f:
                    record = Record.decode(f.read(SIZE))
            except OSError:
                continue
            if record is not None:
                out[record.rank] = record
    return out


class HeartbeatWriter:
    """A worker's side: :meth:`step` on the hot path, a thread that writes the record.

    Args:
        directory: the job's heartbeat directory (:func:`launched_dir` in a launched process).
        rank: the worker's kvstore rank (the record's file name and key).
        interval: seconds between the writer thread's writes.
    """

    def __init__(self, directory: str | Path, rank: int, interval: float = INTERVAL) -> None:
        self.rank = rank
        self.done = 0
        self.issued = -1
        self.here = 0
        self.phase = "train"
        self._parts: dict[str, float] | None = None
        self._servers: list[list[float]] | None = None
        self._first: int | None = None
        self._tick = 0
        self._interval = interval
        self._host = socket.gethostname()
        self._fd = os.open(path_for(directory, rank), os.O_WRONLY | os.O_CREAT, 0o644)
        # only rank 0 stops on the launcher's word: the others wait in the next exchange,
        # so rank 0 keeps whole steps and no collective is needed to agree on one
        self._stop_file = Path(directory, STOP_FILE) if rank == 0 else None
        #: called once, on the writer's thread, when the launcher asks rank 0 to stop
        self.on_stop: Callable[[], None] | None = None
        self.stopped = False  # a step was refused at the launcher's word: no exit barrier
        self._lock = threading.Lock()
        # done/issued change on the training thread and the watcher thread
        self._cv = threading.Condition(threading.RLock())
        self._result: tuple[int, Result | None] | None = None  # the newest update to confirm
        self._watcher: threading.Thread | None = None
        self._error: BaseException | None = None  # what the watcher's wait raised
        self._handed = -1  # the newest update handed to the watcher
        self._write()
        self._thread = threading.Thread(target=self._run, name=f"mxlarge heartbeat {rank}",
                                        daemon=True)
        self._thread.start()

    def step(self, done: int, issued: int) -> None:
        """Record progress: updates before ``done`` are complete, ``issued`` is on its
        way.

        The first call starts this process's count (``here``): its ``issued`` is the
        step the process started at (0, or a checkpoint's step), all before it complete.
        """
        with self._cv:
            if self._first is None:
                self._first = issued
                done = issued
            advanced = done != self.done
            self.done = done
            self.issued = issued
            self.here = done - self._first
            if advanced:
                self._write()

    def set_parts(self, parts: dict[str, float],
                  servers: list[list[float]] | None = None) -> None:
        """The step breakdown the next write carries (:attr:`Record.parts`,
        :attr:`Record.servers`)."""
        self._parts = parts
        self._servers = servers

    def issue(self, step: int) -> None:
        """Record that update ``step`` is on its way (its gradients are pushed)."""
        with self._cv:
            self.step(self.done, step)

    def completes(self, step: int, result: Result) -> None:
        """``result`` exists once update ``step`` is complete: the watcher thread waits
        for it (``result.wait_to_read()``) and then records ``done = step + 1``.

        The watcher takes the newest result handed to it, so ``done`` is a lower bound
        that catches up whenever the engine does. The caller waits only while more than
        :data:`AHEAD` updates are unconfirmed, until at most ``AHEAD // 2`` are.
        """
        with self._cv:
            self._result = (step, result)
            self._handed = step
            self._cv.notify_all()
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, daemon=True,
                                                 name=f"mxlarge heartbeat watcher {self.rank}")
                self._watcher.start()
                # atexit runs the last registered first: this ends before MXNet's own
                # shutdown (registered at its import), which a thread inside MXNet would
                # abort
                atexit.register(self._stop_watcher)
            if step + 1 - self.done > AHEAD:
                self._cv.wait_for(lambda: step + 1 - self.done <= AHEAD // 2
                                  or self._error is not None)
            if self._error is not None:  # an update failed: the training thread hears of it
                raise self._error

    def _watch(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._result is not None)
                item = self._result
                self._result = None
            step, result = item  # type: ignore[misc]  # wait_for returned: item is not None
            if result is None:  # _STOP
                return
            try:
                result.wait_to_read()  # MXNet waits without the GIL
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                with self._cv:
                    self._error = e
                    self._cv.notify_all()
                return
            with self._cv:
                if step + 1 > self.done:
                    self.step(step + 1, self.issued)
                self._cv.notify_all()

    def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the watcher to confirm every update handed to it."""
        with self._cv:
            if self._watcher is not None:
                self._cv.wait_for(lambda: self.done > self._handed or self._error is not None,
                                  timeout)

    def _stop_watcher(self) -> None:
        watcher = self._watcher
        if watcher is None:
            return
        with self._cv:
            self._result = _STOP
            self._cv.notify_all()
        watcher.join(STOP_TIMEOUT)  # a job stuck in an update: the process ends regardless
        self._watcher = None

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Mark a phase without steps (evaluation, checkpointing) for the watchdog."""
        before = self.phase
        self.phase = what
        try:
            yield
        finally:
            self.phase = before

    def finish(self) -> None:
        """Record that this worker's work is done: every update it issued is complete
        (the caller waited for them) and the phase is :data:`FINISHED` from now on."""
        self._stop_watcher()
        with self._cv:
            self.done = max(self.done, self.issued + 1)
            self.here = self.done - (self._first if self._first is not None else self.done)
            self.phase = FINISHED
            self._write()

    def _write(self) -> None:
        with self._lock:  # the step and the writer thread: ticks stay in order
            self._tick += 1
            record = Record(self.rank, self._host, os.getpid(), self.done, self.issued,
                            self.here, self.phase, self._tick, self._parts,
                            self._servers)
            with contextlib.suppress(OSError):  # a full or vanished disk must not stop training
                os.pwrite(self._fd, record.encode(), 0)

    def _run(self) -> None:
        # Runs until the process ends (daemon thread); the launcher removes the
        # directory.
        while True:
            time.sleep(self._interval)
            self._write()
            if self._stop_file is not None and self._stop_file.exists():
                self._stop_file = None
                if self.on_stop is not None:
                    self.on_stop()
