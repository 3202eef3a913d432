"""The sweep file of ``mxlarge sweep``: its frozen dataclasses and strict loading.

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

The file is read by the config loader (:func:`mxlarge.config.load_dataclass` on :class:`Sweep`),
with the same messages as an experiment file.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxlarge.config import ConfigError, _f, load_dataclass, read_yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class SweepRun:
    """One labelled experiment of a sweep (``runs[i]`` of the file)."""

    label: str = field(metadata={"doc": "the name of the group of seeds in reports"})
    config: str = field(metadata={"doc": "experiment YAML: absolute, relative to the sweep "
                                         "file, or to the repository root"})
    overrides: tuple[str, ...] = _f((), "KEY.PATH=VALUE overrides of this run")
    workers: int | None = _f(None, "mode launch: worker processes (default: the sweep's, else "
                                   "the config's)", ge=1)
    servers: int | None = _f(None, "mode launch: server processes (default: the sweep's, else "
                                   "the config's)", ge=1)


@dataclass(frozen=True)
class SweepTarget:
    """The quality target of time to target (``target`` of the file), fixed before any run."""

    reference: str = _f("", "label whose mean final error the target starts from ('': none)")
    tolerance: float = _f(0.0, "added to that mean, as validation error (0.003 = 0.3 points)",
                          ge=0, lt=1)


@dataclass(frozen=True)
class Sweep:
    """A sweep file (module docstring)."""

    name: str = field(metadata={"doc": "names the report directory and the MLflow tag"})
    runs: tuple[SweepRun, ...] = field(metadata={"doc": "the labelled experiments"})
    seeds: tuple[int, ...] = field(metadata={"doc": "seeds of every run", "ge": 0})
    description: str = _f("", "free text")
    mode: str = _f("train", "train (in this process) or launch (mxlarge launch, local cluster)",
                   choices=("train", "launch"))
    workers: int | None = _f(None, "mode launch: -n of every run (default: the config's)", ge=1)
    servers: int | None = _f(None, "mode launch: -s of every run (default: the config's)", ge=1)
    overrides: tuple[str, ...] = _f((), "KEY.PATH=VALUE overrides applied to every run")
    target: SweepTarget = field(default_factory=SweepTarget,
                                metadata={"doc": "for mxlarge report: reference label and "
                                                 "tolerance of the time-to-target goal"})
    source: str = field(default="<sweep>", metadata={"internal": True})



def resolve_config(entry: str, sweep_dir: Path, repo_root: Path = REPO_ROOT) -> Path | None:
    """The experiment file ``entry`` names: absolute, else relative to the sweep file, else to
    the repository root. None if none of these exists."""
    p = Path(entry).expanduser()
    candidates = [p] if p.is_absolute() else [sweep_dir / p, repo_root / p]
    return next((c.resolve() for c in candidates if c.is_file()), None)


def sweep_from_dict(tree: Any, source: str, sweep_dir: Path) -> Sweep:
    """Validates a parsed sweep file strictly with the config loader (unknown keys, types,
    ranges), then what a single field cannot say: the name's form, distinct seeds and labels,
    existing config files.

    Raises:
        ConfigError: naming the file, the key path, the value and what was expected.
    """
    sweep = dataclasses.replace(load_dataclass(Sweep, tree, source), source=source)

    def bad(path: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{source}: {path} = {value!r}: expected {expected}")

    if not NAME_RE.fullmatch(sweep.name):
        raise bad("name", sweep.name, "letters, digits, '.', '_' or '-' (it names the report "
                                      "directory and the MLflow tag)")
    if not sweep.seeds:
        raise bad("seeds", list(sweep.seeds), "a non-empty list of integers >= 0")
    if len(set(sweep.seeds)) != len(sweep.seeds):
        raise bad("seeds", list(sweep.seeds), "distinct seeds")
    labels = [r.label for r in sweep.runs]
    for i, run in enumerate(sweep.runs):
        if not run.label.strip():
            raise bad(f"runs[{i}].label", run.label, "a non-empty string")
        if resolve_config(run.config, sweep_dir) is None:
            raise bad(f"runs[{i}].config", run.config,
                      f"an existing file relative to {sweep_dir} or {REPO_ROOT}")
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise bad("runs[].label", dup[0], "labels that are unique within the sweep")
    if sweep.target.reference and sweep.target.reference not in labels:
        raise bad("target.reference", sweep.target.reference,
                  "one of the run labels: " + ", ".join(labels))
    return sweep


def load_sweep(path: str | Path) -> Sweep:
    """Loads and validates a sweep file (see the module docstring)."""
    path = Path(path)
    return sweep_from_dict(read_yaml(path, "sweep"), str(path), path.resolve().parent)
