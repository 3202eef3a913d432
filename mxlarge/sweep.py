"""``mxlarge sweep``: a grid of labelled experiments × seeds, each one tracked MLflow run.

A sweep file names experiment configs (with overrides) under labels and a list of seeds::

    name: digits-ablation
    mode: train            # train (in this process) | launch (mxlarge launch, local cluster)
    workers: 2             # mode launch: -n (default: the config's dist.workers); also per run
    servers: 1             # mode launch: -s (default: the config's dist.servers); also per run
    runs:
      - {label: baseline, config: ../proxy/digits-baseline.yaml}
      - {label: 16x recipe, config: ../proxy/digits-largebatch.yaml,
         overrides: [data.batch_size=256, dist.kvstore=local, dist.workers=1]}
    seeds: [0, 1, 2]
    overrides: [train.progress=false]   # applied to every run
    target: {reference: baseline, tolerance: 0.003}   # optional, for `mxlarge report`

``target`` fixes the quality target of time-to-target before any run: validation error <=
(mean final error of the ``reference`` label) + ``tolerance``, i.e. the small-batch accuracy
minus a tolerance. It is written on every run as the tag ``sweep_target`` (JSON) for the report.

The grid is runs × seeds, run one cell after another in that order. Every cell is a normal run
tagged ``sweep``, ``sweep_label``, ``seed``, ``sweep_config`` and ``config_hash`` (sha256 of the
resolved config YAML). A cell whose FINISHED run (same sweep, label, seed and hash) is already in
MLflow is skipped, so an interrupted sweep is resumed by running it again; failed cells run again.

Overrides apply in this order, later winning: the sweep's ``overrides``, the run's ``overrides``,
the command line's ``key=value``, then ``train.seed`` from ``seeds`` (which is why no override may
set ``train.seed``). In mode ``launch`` the launcher's own overrides (``dist.kvstore=dist_sync``
for a non-dist config, ``dist.workers``, ``dist.servers``) are applied here too, so that the hash
is the hash of the config the workers run.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mxlarge.config import Config, ConfigError, config_sha256, derive, load_config
from mxlarge.launch_cli import launch_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("train", "launch")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SWEEP_KEYS = ("name", "description", "mode", "workers", "servers", "runs", "seeds", "overrides",
              "target")
TARGET_KEYS = ("reference", "tolerance")
RUN_KEYS = ("label", "config", "overrides", "workers", "servers")
# What `mxlarge launch` prints once it has created the job's run (mxlarge/launch_cli.py).
_LAUNCH_RUN_LINE = re.compile(r"^mxlarge: MLflow run ([0-9a-f]{32}) in ")


@dataclass(frozen=True)
class SweepRun:
    """One labelled experiment of a sweep.

    Attributes:
        label: the name of the group of seeds in reports.
        config: the experiment file as written in the sweep file.
        config_path: the file it resolved to.
        overrides: ``key=value`` overrides of this run.
        workers: mode launch: worker processes (None: the sweep's, else the config's).
        servers: mode launch: server processes (None: the sweep's, else the config's).
    """

    label: str
    config: str
    config_path: Path
    overrides: tuple[str, ...] = ()
    workers: int | None = None
    servers: int | None = None


@dataclass(frozen=True)
class Sweep:
    name: str
    mode: str
    runs: tuple[SweepRun, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    workers: int | None = None
    servers: int | None = None
    description: str = ""
    source: str = "<sweep>"
    target: tuple[str, float] | None = None   # (reference label, tolerance)


@dataclass(frozen=True)
class Cell:
    """One (run, seed) of the grid, resolved and validated.

    Attributes:
        index: position in the grid (0-based).
        overrides: every override, in the order they are applied.
        workers: world size k (1 in mode train).
        servers: parameter servers (mode launch).
        config_hash: sha256 hex digest of ``dump_yaml(cfg)``.
    """

    index: int
    label: str
    seed: int
    config: str
    config_path: Path
    overrides: tuple[str, ...]
    workers: int
    servers: int
    cfg: Config
    config_hash: str


@dataclass(frozen=True)
class CellOutcome:
    cell: Cell
    status: str             # FINISHED, FAILED or SKIPPED
    run_id: str | None
    seconds: float = 0.0
    final_error: float | None = None
    message: str = ""


# ---------------------------------------------------------------------------------------------
# loading


def _unknown(source: str, where: str, key: Any, valid: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    hint = (f" (did you mean '{where}{close[0]}'?)" if close
            else f" (valid keys: {', '.join(valid)})")
    return ConfigError(f"{source}: unknown key '{where}{key}'{hint}")


def _bad(source: str, path: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{source}: {path} = {value!r}: expected {expected}")


def _int_or_none(source: str, path: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(source, path, value, "an integer >= 1")
    return value


def _overrides(source: str, path: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(source, path, value, "a list of KEY.PATH=VALUE strings")
    return tuple(value)


def resolve_config(entry: str, sweep_dir: Path, repo_root: Path = REPO_ROOT) -> Path | None:
    """The experiment file ``entry`` names: absolute, else relative to the sweep file, else to
    the repository root. None if none of these exists."""
    p = Path(entry).expanduser()
    candidates = [p] if p.is_absolute() else [sweep_dir / p, repo_root / p]
    return next((c.resolve() for c in candidates if c.is_file()), None)


def sweep_from_dict(tree: Any, source: str, sweep_dir: Path) -> Sweep:
    """Validates a parsed sweep file strictly: unknown keys, wrong types, duplicate labels.

    Raises:
        ConfigError: naming the file, the key path, the value and what was expected.
    """
    if not isinstance(tree, dict):
        raise _bad(source, "<top level>", tree, "a mapping with name, runs and seeds")
    for key in tree:
        if key not in SWEEP_KEYS:
            raise _unknown(source, "", key, SWEEP_KEYS)
    for key in ("name", "runs", "seeds"):
        if key not in tree:
            raise ConfigError(f"{source}: missing key '{key}'")
    name = tree["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise _bad(source, "name", name, "letters, digits, '.', '_' or '-' (it names the "
                                         "report directory and the MLflow tag)")
    mode = tree.get("mode", "train")
    if mode not in MODES:
        raise _bad(source, "mode", mode, "one of " + ", ".join(MODES))
    description = tree.get("description") or ""
    if not isinstance(description, str):
        raise _bad(source, "description", description, "a string")
    seeds = tree["seeds"]
    if (not isinstance(seeds, list) or not seeds
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)):
        raise _bad(source, "seeds", seeds, "a non-empty list of integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise _bad(source, "seeds", seeds, "distinct seeds")
    runs_in = tree["runs"]
    if not isinstance(runs_in, list) or not runs_in:
        raise _bad(source, "runs", runs_in, "a non-empty list of {label, config, overrides}")
    runs = []
    for i, item in enumerate(runs_in):
        where = f"runs[{i}]"
        if not isinstance(item, dict):
            raise _bad(source, where, item, "a mapping with label and config")
        for key in item:
            if key not in RUN_KEYS:
                raise _unknown(source, f"{where}.", key, RUN_KEYS)
        label, config = item.get("label"), item.get("config")
        if not isinstance(label, str) or not label.strip():
            raise _bad(source, f"{where}.label", label, "a non-empty string")
        if not isinstance(config, str) or not config:
            raise _bad(source, f"{where}.config", config, "the path of an experiment YAML")
        path = resolve_config(config, sweep_dir)
        if path is None:
            raise _bad(source, f"{where}.config", config,
                       f"an existing file relative to {sweep_dir} or {REPO_ROOT}")
        runs.append(SweepRun(label=label, config=config, config_path=path,
                             overrides=_overrides(source, f"{where}.overrides",
                                                  item.get("overrides")),
                             workers=_int_or_none(source, f"{where}.workers", item.get("workers")),
                             servers=_int_or_none(source, f"{where}.servers",
                                                  item.get("servers"))))
    labels = [r.label for r in runs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise _bad(source, "runs[].label", dup[0], "labels that are unique within the sweep")
    target = _target(source, tree.get("target"), labels)
    return Sweep(name=name, mode=mode, runs=tuple(runs), seeds=tuple(seeds),
                 overrides=_overrides(source, "overrides", tree.get("overrides")),
                 workers=_int_or_none(source, "workers", tree.get("workers")),
                 servers=_int_or_none(source, "servers", tree.get("servers")),
                 description=description, source=source, target=target)


def _target(source: str, value: Any, labels: Sequence[str]) -> tuple[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad(source, "target", value, "a mapping {reference: LABEL, tolerance: NUMBER}")
    for key in value:
        if key not in TARGET_KEYS:
            raise _unknown(source, "target.", key, TARGET_KEYS)
    ref, tol = value.get("reference"), value.get("tolerance")
    if ref not in labels:
        raise _bad(source, "target.reference", ref, "one of the run labels: "
                   + ", ".join(labels))
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < 1:
        raise _bad(source, "target.tolerance", tol, "a number in [0, 1) (validation error)")
    return ref, float(tol)


def load_sweep(path: str | Path) -> Sweep:
    """Loads and validates a sweep file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such sweep file")
    try:
        tree = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    return sweep_from_dict(tree, str(path), path.resolve().parent)


# ---------------------------------------------------------------------------------------------
# the grid


def cell_overrides(sweep: Sweep, run: SweepRun, cli: Sequence[str], seed: int) -> list[str]:
    """sweep overrides + run overrides + command-line overrides + ``train.seed=<seed>``.

    Later overrides win (they are applied in order), so the seed always comes from ``seeds``.

    Raises:
        ConfigError: if any override sets ``train.seed``.
    """
    given = [*sweep.overrides, *run.overrides, *cli]
    for item in given:
        if item.partition("=")[0].strip() == "train.seed":
            raise ConfigError(f"{sweep.source}: override {item!r} for '{run.label}': the seed "
                              "comes from 'seeds'")
    return [*given, f"train.seed={seed}"]


def expand(sweep: Sweep, cli: Sequence[str] = ()) -> list[Cell]:
    """The grid runs × seeds, run-major, every config loaded and checked before anything runs.

    Raises:
        ConfigError: a config that does not load or does not fit the mode (a dist store in mode
            train, tracking disabled) or whose global batch does not fit the data.
    """
    cells = []
    for run in sweep.runs:
        for seed in sweep.seeds:
            where = f"{sweep.source}: run '{run.label}' seed {seed}"
            overrides = cell_overrides(sweep, run, cli, seed)
            try:
                cfg = load_config(run.config_path, overrides)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            if sweep.mode == "launch":
                workers = run.workers or sweep.workers or cfg.dist.workers
                servers = run.servers or sweep.servers or cfg.dist.servers
                overrides += launch_overrides(cfg, workers, servers)
                cfg = load_config(run.config_path, overrides)
            else:
                workers, servers = 1, cfg.dist.servers
                if cfg.dist.kvstore.startswith("dist"):
                    raise ConfigError(
                        f"{where}: dist.kvstore = {cfg.dist.kvstore!r}: expected a local store "
                        "in mode train (add dist.kvstore=local dist.workers=1 to the run's "
                        "overrides, or use mode: launch)")
            if not cfg.tracking.enabled:
                raise ConfigError(f"{where}: tracking.enabled = false: expected true (a sweep "
                                  "is read back from MLflow)")
            _check_fits(cfg, workers, where)
            cells.append(Cell(index=len(cells), label=run.label, seed=seed, config=run.config,
                              config_path=run.config_path, overrides=tuple(overrides),
                              workers=workers, servers=servers, cfg=cfg,
                              config_hash=config_sha256(cfg)))
    return cells


def _check_fits(cfg: Config, workers: int, where: str) -> None:
    """A global batch larger than the data fails here, not after the cells before it."""
    samples = cfg.data.train_samples
    if samples is None and cfg.data.dataset in ("digits", "synthetic", "mnist1d"):
        from mxlarge.data import train_size
        samples = train_size(cfg.data)
    if samples is not None:
        derive(cfg, workers * cfg.dist.simulate_workers, samples, where)


def select_part(cells: Sequence[Cell], part: str) -> list[Cell]:
    """Cells ``i-1, i-1+n, i-1+2n, ...`` of ``cells`` for ``part = "i/n"``.

    The parts of ``1/n .. n/n`` are disjoint and cover the grid, so ``n`` sweep processes can
    share one sweep (and one MLflow store) without running a cell twice; each stays resumable.

    Raises:
        ConfigError: unless ``part`` is ``I/N`` with integers ``1 <= I <= N``.
    """
    i, sep, n = part.partition("/")
    if not (sep and i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n)):
        raise ConfigError(f"sweep: --part {part!r}: expected I/N with integers 1 <= I <= N, "
                          "e.g. 1/2")
    mine = [c for j, c in enumerate(cells) if j % int(n) == int(i) - 1]
    # numbered within the part, so that progress lines read "[3/10]" (tags do not use it)
    return [dataclasses.replace(c, index=j) for j, c in enumerate(mine)]


def cell_tags(sweep: Sweep, cell: Cell) -> dict[str, str]:
    tags = {"sweep": sweep.name, "sweep_label": cell.label, "seed": str(cell.seed),
            "config_hash": cell.config_hash, "sweep_config": cell.config,
            "mlflow.runName": f"{sweep.name} / {cell.label} / seed {cell.seed}"}
    if sweep.target is not None:
        tags["sweep_target"] = json.dumps({"reference": sweep.target[0],
                                           "tolerance": sweep.target[1]})
    return tags


def _match_tags(sweep: Sweep, cell: Cell) -> dict[str, str]:
    return {k: v for k, v in cell_tags(sweep, cell).items()
            if k in ("sweep", "sweep_label", "seed", "config_hash")}


# ---------------------------------------------------------------------------------------------
# running


def _final_error(uri: str, run_id: str | None) -> float | None:
    from mxlarge import tracking
    from mxlarge.report import final_error

    if run_id is None:
        return None
    errors = [v for _, v in tracking.metric_history(uri, run_id, "val_error_top1")]
    return final_error(errors) if errors else None


def _run_in_process(sweep: Sweep, cell: Cell, uri: str) -> tuple[str, str | None, str]:
    """Creates the tagged run, trains into it (``MXLARGE_RUN_ID``), ends it."""
    from mxlarge import tracking
    from mxlarge.run import train

    run_id = tracking.create_run(cell.cfg, uri, cell_tags(sweep, cell))
    previous = os.environ.get("MXLARGE_RUN_ID")
    os.environ["MXLARGE_RUN_ID"] = run_id
    ok, message = False, ""
    try:
        train(cell.cfg, f"{cell.config_path} ({sweep.name} / {cell.label})")
        ok = True
    except KeyboardInterrupt:
        message = "interrupted"
        raise
    except Exception as exc:  # noqa: BLE001 - a failing cell must not stop the sweep
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
    finally:
        if previous is None:
            os.environ.pop("MXLARGE_RUN_ID", None)
        else:
            os.environ["MXLARGE_RUN_ID"] = previous
        tracking.end_run(uri, run_id, ok, {"failure": message} if message else None)
    return ("FINISHED" if ok else "FAILED"), run_id, message


def launch_command(cell: Cell) -> list[str]:
    return [sys.executable, "-m", "mxlarge.cli", "launch", str(cell.config_path),
            "-n", str(cell.workers), "-s", str(cell.servers), *cell.overrides]


def _run_launched(sweep: Sweep, cell: Cell, uri: str) -> tuple[str, str | None, str]:
    """Runs ``mxlarge launch`` and tags its run as soon as the launcher has printed its id.

    The job's output goes to a log file, logged as the artifact ``launch.log``; on failure its
    last lines are the message.
    """
    from mxlarge import tracking

    run_id = None
    with tempfile.TemporaryDirectory(prefix="mxlarge-sweep-") as tmp:
        log = Path(tmp) / "launch.log"
        with log.open("w") as out, subprocess.Popen(
                launch_command(cell), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, env={**os.environ, "MLFLOW_TRACKING_URI": uri}) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                m = _LAUNCH_RUN_LINE.match(line)
                if m and run_id is None:
                    run_id = m.group(1)
                    tracking.set_tags(uri, run_id, cell_tags(sweep, cell))
            code = proc.wait()
        tail = log.read_text().strip().splitlines()[-5:]
        if run_id is not None:
            tracking.log_artifacts(uri, run_id, [log])
    if code == 0 and run_id is not None:
        return "FINISHED", run_id, ""
    why = (f"mxlarge launch exited with {code}" if code else
           "the launcher printed no MLflow run id")
    return "FAILED", run_id, why + ": " + " | ".join(t.strip() for t in tail)[-500:]


def run_cell(sweep: Sweep, cell: Cell) -> CellOutcome:
    """Skips the cell if MLflow holds its FINISHED run, else runs it; never raises on failure."""
    from mxlarge import tracking

    uri = tracking.tracking_uri(cell.cfg)
    done = tracking.find_runs(uri, cell.cfg.tracking.experiment, _match_tags(sweep, cell),
                              status="FINISHED")
    if done:
        run_id = done[0]["run_id"]
        return CellOutcome(cell, "SKIPPED", run_id, final_error=_final_error(uri, run_id),
                           message="FINISHED run already in MLflow")
    t0 = time.perf_counter()
    runner = _run_launched if sweep.mode == "launch" else _run_in_process
    status, run_id, message = runner(sweep, cell, uri)
    return CellOutcome(cell, status, run_id, seconds=time.perf_counter() - t0,
                       final_error=_final_error(uri, run_id) if status == "FINISHED" else None,
                       message=message)


def summary_line(o: CellOutcome, total: int) -> str:
    """``[ 3/15] 16x recipe, seed 2: FINISHED in 10.3 s, final error 1.76 % (run 1a2b3c4d)``."""
    c = o.cell
    head = f"[{c.index + 1:>{len(str(total))}}/{total}] {c.label}, seed {c.seed}: "
    if o.status == "SKIPPED":
        body = "skipped, FINISHED run already in MLflow"
    else:
        body = f"{o.status} in {o.seconds:.1f} s"
    if o.final_error is not None:
        body += f", final error {100 * o.final_error:.2f} %"
    if o.status == "FAILED" and o.message:
        body += f": {o.message}"
    return head + body + (f" (run {o.run_id[:8]})" if o.run_id else "")


def run_sweep(sweep: Sweep, cells: Sequence[Cell]) -> list[CellOutcome]:
    """Runs the cells one after another with a tqdm bar and a line per cell."""
    from tqdm.auto import tqdm

    outcomes = []
    bar = tqdm(total=len(cells), desc=f"sweep {sweep.name}", unit="cell", file=sys.stderr,
               dynamic_ncols=True)
    try:
        for cell in cells:
            bar.set_postfix_str(f"{cell.label}, seed {cell.seed}")
            outcome = run_cell(sweep, cell)
            outcomes.append(outcome)
            bar.write(summary_line(outcome, len(cells)), file=sys.stdout)
            bar.update(1)
    finally:
        bar.close()
    return outcomes


def _check_stores(cells: Sequence[Cell]) -> None:
    from mxlarge import tracking

    for uri in sorted({tracking.tracking_uri(c.cfg) for c in cells}):
        try:
            tracking.check_reachable(uri)
        except RuntimeError as exc:
            raise ConfigError(str(exc)) from None


def sweep_command(args: Any) -> int:
    """``mxlarge sweep SWEEP.yaml [key=value ...] [--dry-run] [--part I/N]``: 0 all cells done,
    1 some failed, 2 bad sweep file, config or tracking store (nothing run)."""
    sweep = load_sweep(args.sweep)
    cells = expand(sweep, args.overrides)
    _check_stores(cells)
    print(f"sweep {sweep.name}: {len(sweep.runs)} run(s) x {len(sweep.seeds)} seed(s) = "
          f"{len(cells)} cell(s), mode {sweep.mode}", flush=True)
    if getattr(args, "label", None):
        unknown = sorted(set(args.label) - {r.label for r in sweep.runs})
        if unknown:
            raise ConfigError(f"sweep: --label {unknown[0]!r}: expected one of the labels of "
                              f"{sweep.source}: " + ", ".join(r.label for r in sweep.runs))
        cells = [dataclasses.replace(c, index=j)  # numbered within the selection, as parts
                 for j, c in enumerate(c for c in cells if c.label in args.label)]
        print(f"sweep {sweep.name}: labels {', '.join(args.label)}: {len(cells)} cell(s)",
              flush=True)
    if getattr(args, "part", None):
        cells = select_part(cells, args.part)
        print(f"sweep {sweep.name}: part {args.part}: {len(cells)} cell(s)", flush=True)
    if getattr(args, "dry_run", False):
        from mxlarge import tracking
        for c in cells:
            done = tracking.find_runs(tracking.tracking_uri(c.cfg), c.cfg.tracking.experiment,
                                      _match_tags(sweep, c), status="FINISHED")
            print(f"[{c.index + 1}/{len(cells)}] {c.label}, seed {c.seed}, k={c.workers}, "
                  f"config {c.config_hash[:12]}: {'done' if done else 'to run'}")
        return 0
    outcomes = run_sweep(sweep, cells)
    failed = [o for o in outcomes if o.status == "FAILED"]
    ran = sum(o.status == "FINISHED" for o in outcomes)
    skipped = sum(o.status == "SKIPPED" for o in outcomes)
    print(f"sweep {sweep.name}: {ran} finished, {skipped} skipped, {len(failed)} failed; "
          f"report: mxlarge report {sweep.name}", flush=True)
    if failed:
        names = "; ".join(f"{o.cell.label} seed {o.cell.seed} ({o.message or 'failed'})"
                          for o in failed)
        print(f"mxlarge: error: sweep {sweep.name}: {len(failed)} cell(s) failed: {names}",
              file=sys.stderr, flush=True)
        return 1
    return 0
