"""Shared pieces of the benchmarks: ratios, interleaved rounds, machine facts, launched jobs.

Every reported figure is a :class:`Ratio`: ``values[i] = f(A_i, B_i)`` where ``A_i`` and ``B_i``
were measured back to back in round ``i`` of the same run (:func:`interleave`), so that slow
drifts of a shared machine (another tenant, thermal state) cancel in each pair. A ratio is
summarised by its min, median and max over the rounds; a target is met when the **median** is
on the right side of it.

This module imports no MXNet: worker scripts import it after ``import mxnet``, and the
benchmark driver imports it before deciding what to run.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
RESULT_MARK = "BENCH_RESULT "
PROGRESS_MARK = "BENCH_PROGRESS"


#: Key range of one variant under :class:`OffsetKV`: mxlarge's keys reach 200,001 and must stay
#: below 215,330 (``mxlarge.kvstore.sync.MAX_KEY``), so four variants fit (offsets 0 to 15,000),
#: their parameter, statistic, bucket and collective keys apart for nets of < 5,000 tensors; a
#: bare store's one key per tensor (``pushpull_worker --bare``) takes the next offset.
KEY_STRIDE = 5_000


class OffsetKV:
    """A KVStore seen with every key shifted by ``offset``: two ``SyncStore``s of the same
    tensors on one real store, for A/B rounds inside one job (everything else forwarded)."""

    def __init__(self, kv: Any, offset: int):
        self._kv = kv
        self._offset = offset

    def _keys(self, key: Any) -> Any:
        if isinstance(key, (list, tuple)):
            return [k + self._offset for k in key]
        return key + self._offset

    def init(self, key: Any, value: Any) -> None:
        self._kv.init(self._keys(key), value)

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        self._kv.push(self._keys(key), value, priority=priority)

    def pull(self, key: Any, out: Any = None, priority: int = 0,
             ignore_sparse: bool = True) -> None:
        self._kv.pull(self._keys(key), out=out, priority=priority, ignore_sparse=ignore_sparse)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        self._kv.pushpull(self._keys(key), value, out=out, priority=priority)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


class BenchmarkError(RuntimeError):
    """A benchmark could not produce its measurements (a crash, not a missed target)."""


@dataclass
class Ratio:
    """One reported figure: a ratio per round, with an optional target.

    Attributes:
        key: stable identifier, e.g. ``trainer_overhead``.
        title: what is divided by what, for humans.
        values: the ratio of each round.
        target: the bound the median must meet, or ``None`` (reported only).
        higher_is_better: ``True`` if the target is a lower bound (median ≥ target), ``False``
            if it is an upper bound (median ≤ target).
        unit: printed after the numbers (``""`` for a plain ratio, ``"%"`` scales by 100).
        note: one line of context (sizes, what was measured).
    """

    key: str
    title: str
    values: list[float]
    target: float | None = None
    higher_is_better: bool = True
    unit: str = ""
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def status(self) -> str:
        """``PASS``/``MISS`` against the target (on the median), ``info`` without one."""
        if self.target is None:
            return "info"
        ok = self.median >= self.target if self.higher_is_better else self.median <= self.target
        return "PASS" if ok else "MISS"

    def fmt(self, x: float) -> str:
        return f"{100 * x:.1f}%" if self.unit == "%" else f"{x:.3f}"

    def target_text(self) -> str:
        if self.target is None:
            return "—"
        return ("≥ " if self.higher_is_better else "≤ ") + self.fmt(self.target)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "values": self.values,
                "min": min(self.values), "median": self.median, "max": max(self.values),
                "rounds": len(self.values), "target": self.target,
                "higher_is_better": self.higher_is_better, "unit": self.unit,
                "status": self.status, "note": self.note}


@dataclass
class BenchResult:
    """What one benchmark returns: its ratios, context measurements and markdown details."""

    name: str
    ratios: list[Ratio] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    markdown: str = ""
    seconds: float = 0.0
    commit: str | None = None  # what was measured: ``git_commit()`` when the benchmark started


def worker_main(parse: Callable[[list[str] | None], Any], work: Callable[[Any], None],
                argv: list[str] | None = None) -> int:
    """Entry point of a benchmark worker script run as every role of a launched job."""
    import os

    if os.environ.get("DMLC_ROLE", "worker") != "worker":
        return 0  # not reached for ps-lite roles: they exit inside `import mxnet`
    opts = parse(argv)
    from mxlarge.protocol.failfast import fail_fast
    with fail_fast():
        work(opts)
    return 0


def ratios_of(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[i] / b[i]`` for each round i (same length: one pair per round)."""
    if len(a) != len(b) or not a:
        raise BenchmarkError(f"unpaired rounds: {len(a)} vs {len(b)}")
    return [x / y for x, y in zip(a, b, strict=True)]


def interleave(modes: Mapping[str, Callable[[], Any]], reps: int,
               progress: Callable[[], None] | None = None) -> dict[str, list[Any]]:
    """Runs each mode once per round, ``reps`` rounds, alternating the order (ABAB → AB, BA, ...).

    Reversing the order every other round puts each mode first as often as last, so a mode is
    not systematically the one that runs right after the previous round's other mode (caches,
    allocator state, frequency).

    Args:
        modes: name → callable doing one timed measurement and returning it (a number, or a
            list of per-iteration numbers).
        reps: rounds (≥ 1).
        progress: called after each measurement.

    Returns:
        name → one measurement per round, in round order.
    """
    names = list(modes)
    out: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(reps):
        for n in (names if r % 2 == 0 else names[::-1]):
            out[n].append(modes[n]())
            if progress is not None:
                progress()
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def emit_result(payload: Mapping[str, Any]) -> None:
    """Prints the one machine-readable line a worker script reports (see :class:`JobOutput`)."""
    print(RESULT_MARK + json.dumps(payload), flush=True)


def emit_progress() -> None:
    print(PROGRESS_MARK, flush=True)


def git_commit(repo: Path = Path(__file__).resolve().parents[1]) -> str | None:
    """``HEAD`` of the checkout the benchmarks run from, with ``+dirty`` when tracked files
    other than results (``benchmarks/results/``, which one benchmark writes while the next
    runs) differ from it (the measured code is then not exactly that commit); ``None`` outside
    git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)benchmarks/results"],
                               cwd=repo, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, Python/MXNet/NumPy/GluonCV versions and the date (UTC).

    Package versions are the installed distributions' (``importlib.metadata``): GluonCV
    0.10.5.post0's module says ``__version__ = '0.11.0'``.
    """
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "mxnet": version("mxnet"),
        "numpy": version("numpy"),
        "gluoncv": version("gluoncv"),
        "platform": platform.platform(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class JobOutput:
    """A text sink for :func:`mxlarge.launcher.run_local` that collects worker results.

    Lines containing :data:`RESULT_MARK` are parsed as JSON; :data:`PROGRESS_MARK` lines advance
    ``bar``; every line is also appended to ``log`` (the whole job's output, for post-mortems).
    """

    def __init__(self, log: IO[str] | None, bar: Any = None):
        self.log = log
        self.bar = bar
        self.results: list[dict[str, Any]] = []
        self.tail: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            for line in text.splitlines():
                if RESULT_MARK in line:
                    self.results.append(json.loads(line.split(RESULT_MARK, 1)[1]))
                elif PROGRESS_MARK in line:
                    if self.bar is not None:
                        self.bar.update(1)
                    continue
                self.tail = (self.tail + [line])[-40:]
                if self.log is not None:
                    self.log.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.log is not None:
            self.log.flush()


def launch(module: str, args: Sequence[str], *, workers: int, servers: int,
           env: Mapping[str, str] | None = None, log: IO[str] | None = None, bar: Any = None,
           timeout_note: str = "", tuning: bool = True) -> list[dict[str, Any]]:
    """Runs ``python -m module args`` as a local dist_sync job and returns each worker's result
    (with the launcher's process settings unless ``tuning`` is False).

    Raises:
        BenchmarkError: if the job failed or a worker reported nothing (the last lines of
            its output are in the message).
    """
    from mxlarge.launcher import run_local

    job_env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "PYTHONWARNINGS": "ignore", **(env or {})}
    out = JobOutput(log, bar)
    if log is not None:
        log.write(f"=== {module} {' '.join(args)} workers={workers} servers={servers} "
                  f"env={dict(env or {})} tuning={tuning} {timeout_note}\n")
    outcome = run_local([sys.executable, "-m", module, *args], workers=workers, servers=servers,
                        env=job_env, output=out, tuning=tuning)
    out.flush()
    if outcome.exit_code != 0 or len(out.results) != workers:
        tail = "\n".join(out.tail[-15:])
        raise BenchmarkError(f"{module} with {workers} worker(s), {servers} server(s): "
                             f"{outcome.message}; {len(out.results)} result(s)\n{tail}")
    return sorted(out.results, key=lambda r: r.get("rank", 0))


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mmm(xs: Sequence[float], fmt: str = "{:.3g}") -> str:
    """``min / median / max`` of absolute measurements, for context columns."""
    return " / ".join(fmt.format(v) for v in (min(xs), median(xs), max(xs)))
