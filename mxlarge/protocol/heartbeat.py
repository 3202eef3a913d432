"""Progress reports from workers to their launcher: one small file per rank, no KVStore traffic.

The launcher gives every process of a job the directory :data:`ENV` (``MXLARGE_HEARTBEAT_DIR``);
:func:`launched_dir` is the only place that reads it, at a process's root: ``mxlarge train``
(``mxlarge.cli._train``) reads it once and passes the directory down to the
:class:`mxlarge.Trainer` it builds; a script of the user's that builds its own Trainer gets it
through the Trainer's default ``heartbeat=LAUNCHED``. A worker with a directory writes
``worker-<rank>.json`` there, a :class:`Record` padded to :data:`SIZE` bytes and rewritten
in place (one ``pwrite``, so a reader sees an old or a new record, never a mix of both lengths).

What is cheap, and why it is correct:

* The training step writes the record when an update completes (one ``pwrite`` of
  :data:`SIZE` bytes to an open file, a few microseconds: ``make bench`` row
  ``heartbeat_cost``), so the last record of a crashed worker names its last step exactly
  (the restart policy compares steps). A daemon thread also writes it every :data:`INTERVAL`.
* MXNet runs the step asynchronously: Python returns from ``trainer.step`` long before the
  engine has pushed, pulled and updated, and could run ahead of a stuck job indefinitely. So
  ``done`` only counts an update after its result exists (the Trainer waits for update t−1
  when it issues update t, while update t's forward/backward are already queued, which costs
  the engine nothing), and Python never gets more than one step ahead of the real progress.
* The writer thread's counter ``tick`` tells the launcher whether a process runs at all: a
  worker stopped by SIGSTOP, a frozen VM or a dead node stops ticking, while a worker that
  merely waits in push/pull for a slow peer keeps ticking (MXNet waits without the GIL).

On a shared filesystem (cluster launchers) the records reach the launcher as fast as the
filesystem propagates writes (NFS: the client's write-back and attribute caching, seconds to
tens of seconds): choose a stall timeout well above that.
"""
from __future__ import annotations

import contextlib
import enum
import json
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ENV = "MXLARGE_HEARTBEAT_DIR"
SIZE = 512
INTERVAL = 1.0  # seconds between writes of one worker's record
# The phase of a worker whose work is done: every worker passed the store's last barrier, what
# is left is MXNet's shutdown (written at exit by mxlarge.kvstore.shutdown).
FINISHED = "finished"


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
    """

    rank: int
    host: str
    pid: int
    done: int
    issued: int
    here: int
    phase: str
    tick: int

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


def path_for(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}.json"


class Launched(enum.Enum):
    """The type of :data:`LAUNCHED`."""

    DIR = "the heartbeat directory of the launcher that started this process, if any"


# mxlarge.Trainer's default ``heartbeat``: resolved by :func:`launched_dir` at construction.
LAUNCHED = Launched.DIR


def launched_dir() -> Path | None:
    """The heartbeat directory the launcher gave this process (:data:`ENV`), or ``None`` when
    no launcher asked for heartbeats (a process not started by ``mxlarge launch`` or
    ``python -m mxlarge.launcher``).

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


class Beat:
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
        self._first: int | None = None
        self._tick = 0
        self._interval = interval
        self._host = socket.gethostname()
        self._fd = os.open(path_for(directory, rank), os.O_WRONLY | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._write()
        _live.add(self)
        self._thread = threading.Thread(target=self._run, name=f"mxlarge heartbeat {rank}",
                                        daemon=True)
        self._thread.start()

    def step(self, done: int, issued: int) -> None:
        """Record progress: updates before ``done`` are complete, ``issued`` is on its way.

        The first call starts this process's count (``here``): its ``issued`` is the step the
        process started at (0, or a checkpoint's step), all before it complete.
        """
        if self._first is None:
            self._first = done = issued
        advanced = done != self.done
        self.done, self.issued, self.here = done, issued, done - self._first
        if advanced:
            self._write()

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Mark a phase without steps (evaluation, checkpointing) for the watchdog."""
        before, self.phase = self.phase, what
        try:
            yield
        finally:
            self.phase = before

    def finish(self) -> None:
        """Record that this worker's work is done: every update it issued is complete (the
        caller waited for them) and the phase is :data:`FINISHED` from now on."""
        self.done = max(self.done, self.issued + 1)
        self.here = self.done - (self._first if self._first is not None else self.done)
        self.phase = FINISHED
        self._write()

    def _write(self) -> None:
        with self._lock:  # the step and the writer thread: ticks stay in order
            self._tick += 1
            record = Record(self.rank, self._host, os.getpid(), self.done, self.issued,
                            self.here, self.phase, self._tick)
            with contextlib.suppress(OSError):  # a full or vanished disk must not stop training
                os.pwrite(self._fd, record.encode(), 0)

    def _run(self) -> None:
        # Runs until the process ends (daemon thread); the launcher removes the directory.
        while True:
            time.sleep(self._interval)
            self._write()


_live: weakref.WeakSet[Beat] = weakref.WeakSet()  # this process's Beats (their threads hold them)


def finish_all() -> None:
    """:meth:`Beat.finish` for every Beat of this process (at exit, after the last barrier)."""
    for beat in list(_live):
        beat.finish()
