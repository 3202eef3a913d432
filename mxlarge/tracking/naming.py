"""What a training run is called, how it is described and which params it has.

Name: what tells a run apart (``digits-largebatch 24ep s0``: the config, what an override
changed in the world or the schedule, the seed), description the plan as a table, params the
config keys that take effect (the rules: 'What a run holds' in docs/design/tracking.md).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mxlarge.config import STORE_SUMS, Condition, Config, applies, conditions, flatten
from mxlarge.errors import InputError
from mxlarge.plan import precision

REPO_ROOT = Path(__file__).resolve().parents[2]


def shown_path(path: str | Path) -> str:
    """``path`` relative to the repository when it lies inside it, else as given."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def as_written(source: str | Path | None) -> Config | None:
    """The experiment file ``source`` without overrides, None when there is none (or it does
    not load on its own)."""
    from mxlarge.config import load_config

    if not source or not Path(source).is_file():
        return None
    try:
        return load_config(str(source), [])
    except InputError:  # a file valid only with its overrides: nothing to compare with
        return None


# What an override may change in the schedule, as a run name shows it (in this order); the
# last field of each: shown when there is no file to compare with.
NAMED_CHANGES: tuple[tuple[str, Any, bool], ...] = (
    ("{}ep", lambda c: c.train.epochs, True),
    ("{}steps", lambda c: c.train.max_steps, True),
    ("lr{:g}", lambda c: c.optim.base_lr, False),
)


def states_world(label: str, world: Any) -> bool:
    """Whether a sweep's ``label`` already says the world: its numbers hold K (gradient
    contributors) and later n (images each), e.g. ``16x (16 workers x 16)`` for 16×16; then a
    name that added ``16×16`` would say it twice."""
    numbers = [int(x) for x in re.findall(r"\d+", label)]
    if world.units not in numbers:
        return False
    return world.batch in numbers[numbers.index(world.units) + 1:]


def run_name(cfg: Config, world: Any, label: str | None = None,
             written: Config | None = None) -> str:
    """What tells a run apart, in that order and as short as that allows (MLflow's runs list
    shows about 20 characters of a name): the label (a sweep's) or the config's name; what an
    override changed in the world or the schedule against the file as ``written`` (without a
    file: the world and the epochs): the world ``K×n`` (gradient contributors × images each), then
    :data:`NAMED_CHANGES` (``5ep``, ``90steps``, ``lr0.1``); then the seed ``sS``. E.g.
    ``digits-largebatch s0``, ``digits-largebatch 24ep s0``, ``16x recipe 16×32 s2``; no world
    when the label says it (:func:`states_world`): ``16x (16 workers x 16) s0``. In a sweep the
    label and the seed alone are unique (labels are); elsewhere
    :meth:`~mxlarge.tracking.run.RunHandle.create` makes the name unique in the experiment."""
    from mxlarge.plan import world_of

    try:
        was = world_of(written) if written is not None else None
    except InputError:  # a world that only the overrides make valid
        was = None
    parts = [label or cfg.name]
    changed = was is None or (was.units, was.batch) != (world.units, world.batch)
    if changed and not (label and states_world(label, world)):
        parts.append(f"{world.units}×{world.batch}")
    for fmt, get, without_file in NAMED_CHANGES:
        value = get(cfg)
        if value is not None and (get(written) != value if written is not None
                                  else without_file):
            parts.append(fmt.format(value))
    parts.append(f"s{cfg.train.seed}")
    return " ".join(parts)


def describe_run(cfg: Config, plan: Any, source: str | None = None,
                 label: str | None = None) -> str:
    """The run's description (``mlflow.note.content``, markdown): what it trains, the plan."""
    shown = shown_path(Path(source).resolve()) if source and Path(source).is_file() else None
    what = f"**{label or cfg.name}**" + (f" (`{shown}`)" if shown else "")
    lines = [f"{what}: {cfg.model.name} on {cfg.data.dataset}, {plan.world.describe()}, "
             f"{cfg.train.epochs} epochs.", "", "| plan | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in plan.summary().items()]
    lines += [f"| precision ({k}) | {v} |" for k, v in precision(cfg).items()]
    return "\n".join(lines)


# Config keys (and ``net.*`` facts) that take effect only when another key says so: no
# `optim.lars_eta` param on a run without LARS; on one process of one CPU device no `dist.*` at
# all (its world is the plan's: `plan.workers`, `plan.devices_per_worker`,
# `plan.simulated_workers`; Gluon makes no store for one device; MXNet's default context is the
# CPU). A config key's condition is its schema field's `when` (mxlarge/config/schema.py, which
# docs/config.md shows); config.applies handles the dataset- and model-specific keys.
TAKES_EFFECT: dict[str, Condition] = {
    **conditions(), "net.params_pushed": STORE_SUMS, "net.params_pushed_elements": STORE_SUMS}


def takes_effect(key: str, value: Any, cfg: Config) -> bool:
    """Whether config ``key`` = ``value`` is a param of ``cfg``'s run: it applies to the dataset
    and model (:func:`mxlarge.config.applies`), the keys it depends on enable it
    (:data:`TAKES_EFFECT`) and it has a value (no None, no empty string or list)."""
    if key == "name" or value is None or value in ("", (), []):
        return False
    return applies(key, cfg) and TAKES_EFFECT.get(key, lambda c: True)(cfg)


def run_params(cfg: Config, uri: str, plan: Any) -> dict[str, str]:
    """The params of a training run: the keys that take effect, ``tracking.uri`` as resolved,
    paths inside the repository relative to it, the plan's numbers as ``plan.*``; each value
    cut to 500 characters."""
    params: dict[str, Any] = {k: v for k, v in flatten(cfg).items()
                              if takes_effect(k, v, cfg)}
    params["tracking.uri"] = uri
    for k, v in params.items():
        if isinstance(v, str) and v.startswith("/"):
            params[k] = shown_path(v)
    params.update({f"plan.{k}": v for k, v in plan.summary().items()})
    return {k: str(v)[:500] for k, v in params.items()}
