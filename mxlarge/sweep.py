"""``mxlarge sweep``: a grid of labelled experiments × seeds, each one tracked MLflow run.

The sweep file and its strict loading are :mod:`mxlarge.sweep_file`. The grid is runs × seeds,
run one cell after another in that order. Every cell is a normal run tagged ``sweep``,
``sweep_label``, ``seed``, ``sweep_config`` and ``config_hash`` (sha256 of the resolved config
YAML). A cell whose FINISHED run (same sweep, label, seed and hash) is already in
MLflow is skipped, so an interrupted sweep is resumed by running it again; failed cells run again.

Overrides apply in this order, later winning: the sweep's ``overrides``, the run's ``overrides``,
the command line's ``key=value``, then ``train.seed`` from ``seeds`` (which is why no override may
set ``train.seed``). In mode ``launch`` the config is the launcher's own
(:func:`mxlarge.launch_cli.launch_config`: ``dist.kvstore=dist_sync`` for a non-dist config,
``-n`` as ``dist.workers``, ``-s`` as ``dist.servers``), so that the hash is the hash of the
config the workers run.

Each cell's MLflow run is opened here, passed down (to :func:`mxlarge.run.train` in this
process, or ``mxlarge launch --run-id``) and ended here.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxlarge.config import Config, ConfigError, config_sha256, load_config
from mxlarge.launch_cli import launch_config
from mxlarge.sweep_file import Sweep, SweepRun, load_sweep, resolve_config


@dataclass(frozen=True)
class Cell:
    """One (run, seed) of the grid, resolved and validated.

    Attributes:
        index: position in the grid (0-based).
        overrides: every override, in the order they are applied.
        workers: worker processes (from the plan).
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
    """The grid runs × seeds, run-major, every config loaded and planned before anything runs.

    Raises:
        ConfigError: a config that does not load or does not fit the mode (a dist store in mode
            train, tracking disabled) or whose plan fails (e.g. a batch larger than the data).
    """
    from mxlarge.plan import plan_for, servers_of

    cells: list[Cell] = []
    for run in sweep.runs:
        path = resolve_config(run.config, Path(sweep.source).resolve().parent)
        if path is None:
            raise ConfigError(f"{sweep.source}: runs[].config = {run.config!r}: expected an "
                              "existing file")
        for seed in sweep.seeds:
            where = f"{sweep.source}: run '{run.label}' seed {seed}"
            overrides = cell_overrides(sweep, run, cli, seed)
            try:
                if sweep.mode == "launch":
                    cfg, _, overrides = launch_config(path, overrides,
                                                      run.workers or sweep.workers,
                                                      run.servers or sweep.servers)
                else:
                    cfg = load_config(path, overrides)
                    if cfg.dist.kvstore.startswith("dist"):
                        raise ConfigError(
                            f"dist.kvstore = {cfg.dist.kvstore!r}: expected a local store in "
                            "mode train (add dist.kvstore=local dist.workers=1 to the run's "
                            "overrides, or use mode: launch)")
                if not cfg.tracking.enabled:
                    raise ConfigError("tracking.enabled = false: expected true (a sweep is read "
                                      "back from MLflow)")
                plan = plan_for(cfg, str(path))
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            cells.append(Cell(index=len(cells), label=run.label, seed=seed, config=run.config,
                              config_path=path, overrides=tuple(overrides),
                              workers=plan.world.processes, servers=servers_of(cfg), cfg=cfg,
                              config_hash=config_sha256(cfg)))
    return cells


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
    """What finds a cell's run again (``sweep``, ``sweep_label``, ``seed``, ``config_hash``),
    the experiment file relative to the repository (``sweep_config``) and the target; the
    label names the run (:func:`mxlarge.tracking.run_name`)."""
    from mxlarge.tracking import shown_path

    tags = {"sweep": sweep.name, "sweep_label": cell.label, "seed": str(cell.seed),
            "config_hash": cell.config_hash, "sweep_config": shown_path(cell.config_path)}
    if sweep.target.reference:
        tags["sweep_target"] = json.dumps({"reference": sweep.target.reference,
                                           "tolerance": sweep.target.tolerance})
    return tags


def _match_tags(sweep: Sweep, cell: Cell) -> dict[str, str]:
    return {k: v for k, v in cell_tags(sweep, cell).items()
            if k in ("sweep", "sweep_label", "seed", "config_hash")}


# ---------------------------------------------------------------------------------------------
# running


def _final_error(uri: str, run_id: str | None) -> float | None:
    from mxlarge.reporting.store import run_final_error_of

    return None if run_id is None else run_final_error_of(uri, run_id)


def _run_in_process(sweep: Sweep, cell: Cell, run: Any) -> tuple[bool, str]:
    """Trains the cell in this process into ``run``; a failure is returned, not raised."""
    from mxlarge.run import train

    try:
        train(cell.cfg, f"{cell.config_path} ({sweep.name} / {cell.label})",
              run_id=run.run_id)
    except Exception as exc:  # noqa: BLE001 - a failing cell must not stop the sweep
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return True, ""


def launch_command(cell: Cell, run_id: str) -> list[str]:
    return [sys.executable, "-m", "mxlarge.cli", "launch", str(cell.config_path),
            "-n", str(cell.workers), "-s", str(cell.servers), *cell.overrides,
            "--run-id", run_id]


def _run_launched(sweep: Sweep, cell: Cell, run: Any) -> tuple[bool, str]:
    """Runs ``mxlarge launch --run-id`` into ``run``; its output is the artifact
    ``launch.log``, and on failure its last lines are the message."""
    with tempfile.TemporaryDirectory(prefix="mxlarge-sweep-") as tmp:
        log = Path(tmp) / "launch.log"
        with log.open("w") as out:
            code = subprocess.run(launch_command(cell, run.run_id), stdout=out,
                                  stderr=subprocess.STDOUT,
                                  env={**os.environ, "MLFLOW_TRACKING_URI": run.uri}).returncode
        tail = log.read_text().strip().splitlines()[-5:]
        run.log_artifacts([log])
    if code == 0:
        return True, ""
    return False, f"mxlarge launch exited with {code}: " + " | ".join(
        t.strip() for t in tail)[-500:]


def run_cell(sweep: Sweep, cell: Cell, parent: Any = None) -> CellOutcome:
    """Skips the cell if MLflow holds its FINISHED run, else runs it as a child of ``parent``
    (the sweep's run); never raises on failure."""
    from mxlarge import tracking

    uri = tracking.tracking_uri(cell.cfg)
    done = tracking.find_runs(uri, tracking.experiment_name(cell.cfg), _match_tags(sweep, cell),
                              status="FINISHED")
    if done:
        run_id = done[0]["run_id"]
        return CellOutcome(cell, "SKIPPED", run_id, final_error=_final_error(uri, run_id),
                           message="FINISHED run already in MLflow")
    t0 = time.perf_counter()
    run = tracking.RunHandle.create(cell.cfg, uri, cell_tags(sweep, cell), parent=parent,
                                    source=str(cell.config_path))
    runner = _run_launched if sweep.mode == "launch" else _run_in_process
    ok = False
    message = "interrupted"
    try:
        ok, message = runner(sweep, cell, run)
    finally:
        run.end(ok, {"failure": message[:500]} if message else None)
    return CellOutcome(cell, "FINISHED" if ok else "FAILED", run.run_id,
                       seconds=time.perf_counter() - t0,
                       final_error=_final_error(uri, run.run_id) if ok else None,
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


def parent_params(sweep: Sweep) -> dict[str, str]:
    """The sweep parent's params: the sweep file (relative to the repository), its mode, seeds,
    overrides and target that have a value; the labels that ran are the tag ``sweep_labels``."""
    from mxlarge.tracking import shown_path

    ref = sweep.target.reference
    params = {"sweep.file": shown_path(Path(sweep.source).resolve()), "sweep.mode": sweep.mode,
              "sweep.seeds": ",".join(map(str, sweep.seeds)),
              "sweep.overrides": " ".join(sweep.overrides), "sweep.target.reference": ref,
              "sweep.target.tolerance": str(sweep.target.tolerance) if ref else ""}
    return {k: v for k, v in params.items() if v}


def parent_description(sweep: Sweep) -> str:
    """The sweep parent's description until ``mxlarge report`` writes its table there."""
    lines = [f"**sweep {sweep.name}**" + (f": {sweep.description}" if sweep.description else ""),
             "", f"{len(sweep.runs)} label(s) x seeds {', '.join(map(str, sweep.seeds))}, mode "
             f"{sweep.mode}; `mxlarge report {sweep.name}` puts its table here.", "",
             "| label | config | overrides |", "|---|---|---|"]
    lines += [f"| {r.label} | `{r.config}` | {' '.join(r.overrides) or '—'} |"
              for r in sweep.runs]
    return "\n".join(lines)


def run_sweep(sweep: Sweep, cells: Sequence[Cell],
              parents: dict[tuple[str, str], Any] | None = None) -> list[CellOutcome]:
    """Runs the cells one after another with a tqdm bar and a line per cell, as child runs of
    the sweep's parent run (one per store and experiment, collected in ``parents``), which
    ends FINISHED if no cell failed."""
    from tqdm.auto import tqdm

    from mxlarge import tracking

    parents = {} if parents is None else parents
    for c in cells:
        key = (tracking.tracking_uri(c.cfg), tracking.experiment_name(c.cfg))
        if key not in parents:
            parents[key] = tracking.sweep_parent(*key, sweep.name, parent_params(sweep),
                                                 parent_description(sweep))
    outcomes = []
    # disable=None: no bar unless stderr is a terminal, so a pipe or log file never gets
    # carriage-return frames; the line per cell is printed either way
    bar = tqdm(total=len(cells), desc=f"sweep {sweep.name}", unit="cell", file=sys.stderr,
               dynamic_ncols=True, disable=None)
    try:
        for cell in cells:
            bar.set_postfix_str(f"{cell.label}, seed {cell.seed}")
            key = (tracking.tracking_uri(cell.cfg), tracking.experiment_name(cell.cfg))
            outcome = run_cell(sweep, cell, parents[key])
            outcomes.append(outcome)
            bar.write(summary_line(outcome, len(cells)), file=sys.stdout)
            bar.update(1)
    finally:
        bar.close()
        ok = len(outcomes) == len(cells) and all(o.status != "FAILED" for o in outcomes)
        for key, parent in parents.items():  # tag: the labels that ran, in any invocation
            ran = [x for x in parent.tags().get("sweep_labels", "").split(", ") if x] + [
                o.cell.label for o in outcomes if o.status != "FAILED" and key == (
                    tracking.tracking_uri(o.cell.cfg), tracking.experiment_name(o.cell.cfg))]
            parent.end(ok, {"sweep_labels": ", ".join(dict.fromkeys(ran))} if ran else None)
    return outcomes


def _check_stores(cells: Sequence[Cell]) -> None:
    from mxlarge import tracking

    for uri in sorted({tracking.tracking_uri(c.cfg) for c in cells}):
        tracking.check_reachable(uri)


def sweep_command(args: Any) -> int:
    """``mxlarge sweep SWEEP.yaml [key=value ...] [--dry-run] [--label L] [--part I/N]``: 0 all
    cells done, 1 some failed, 2 bad sweep file, config or tracking store (nothing run)."""
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
            done = tracking.find_runs(tracking.tracking_uri(c.cfg), tracking.experiment_name(c.cfg),
                                      _match_tags(sweep, c), status="FINISHED")
            print(f"[{c.index + 1}/{len(cells)}] {c.label}, seed {c.seed}, k={c.workers}, "
                  f"config {c.config_hash[:12]}: {'done' if done else 'to run'}")
        return 0
    from mxlarge.tracking import ui_hint

    parents: dict[tuple[str, str], Any] = {}
    outcomes = run_sweep(sweep, cells, parents)
    failed = [o for o in outcomes if o.status == "FAILED"]
    ran = sum(o.status == "FINISHED" for o in outcomes)
    skipped = sum(o.status == "SKIPPED" for o in outcomes)
    print(f"sweep {sweep.name}: {ran} finished, {skipped} skipped, {len(failed)} failed; "
          f"report: mxlarge report {sweep.name}", flush=True)
    for parent in parents.values():
        print(f"MLflow sweep run {parent.run_id}: {ui_hint(parent.uri, parent.run_id)}",
              flush=True)
    if failed:
        names = "; ".join(f"{o.cell.label} seed {o.cell.seed} ({o.message or 'failed'})"
                          for o in failed)
        print(f"mxlarge: error: sweep {sweep.name}: {len(failed)} cell(s) failed: {names}",
              file=sys.stderr, flush=True)
        return 1
    return 0
