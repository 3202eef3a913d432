"""A run's handle and life: :class:`RunHandle` (store URI + run id, passed down as a value) and
:func:`open_run`, the one decision of which run a process logs into, ended by
:meth:`OpenRun.close` (the policy: 'Which run a process logs into' in docs/design/tracking.md).
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow

from mxlarge.config import Config
from mxlarge.errors import InputError
from mxlarge.tracking import model
from mxlarge.tracking.naming import as_written, describe_run, run_name, run_params
from mxlarge.tracking.queries import find_runs, metric_history
from mxlarge.tracking.store import (
    caller_run_id,
    check_reachable,
    client,
    experiment_id,
    experiment_name,
    system_tags,
    tracking_uri,
)


def _log_params(c: Any, run_id: str, params: dict[str, Any]) -> None:
    """``params`` in batches of 100, each value cut to 500 characters."""
    items = [mlflow.entities.Param(k, str(v)[:500]) for k, v in params.items()]
    for lo in range(0, len(items), 100):
        c.log_batch(run_id, params=items[lo:lo + 100])


def unique_run_name(c: Any, experiment: str, name: str) -> str:
    """``name``, or ``name #2``, ``name #3``, ... when a run of the experiment has it (a
    repeat of the same command; two processes naming a run at the same instant may still
    agree)."""
    prefix = name.split("'")[0].split("%")[0]
    taken = {r.info.run_name for r in c.search_runs(
        [experiment], filter_string=f"attributes.run_name LIKE '{prefix}%'",
        max_results=5000)}
    n = 1
    while (candidate := name if n == 1 else f"{name} #{n}") in taken:
        n += 1
    return candidate


@dataclass(frozen=True)
class RunHandle:
    """One MLflow run of a job: where it is stored and its id."""

    uri: str
    run_id: str

    @classmethod
    def create(cls, cfg: Config, uri: str, tags: dict[str, Any] | None = None,
               parent: RunHandle | None = None, plan: Any = None,
               source: str | None = None) -> RunHandle:
        """A RUNNING run named, described and with params by :mod:`mxlarge.tracking.naming`; a
        child of ``parent``. ``plan`` defaults to :func:`mxlarge.plan.plan_for` of ``cfg``;
        ``source`` is the experiment file (for the description); a ``sweep_label`` tag names
        the run instead of ``cfg.name``."""
        from mxlarge.plan import plan_for

        plan = plan or plan_for(cfg)
        label = (tags or {}).get("sweep_label")
        c = client(uri)
        exp = experiment_id(c, experiment_name(cfg))
        name = unique_run_name(c, exp, run_name(cfg, plan.world, label, as_written(source)))
        all_tags = {**system_tags(), "mlflow.runName": name,
                    "mlflow.note.content": describe_run(cfg, plan, source, label),
                    **(tags or {})}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id
        run = c.create_run(exp, tags={k: str(v) for k, v in all_tags.items()})
        _log_params(c, run.info.run_id, run_params(cfg, uri, plan))
        return cls(uri, run.info.run_id)

    @classmethod
    def create_plain(cls, uri: str, experiment: str, tags: dict[str, Any],
                     params: dict[str, Any] | None = None) -> RunHandle:
        """A RUNNING run without a training config (e.g. a sweep's parent)."""
        c = client(uri)
        run = c.create_run(experiment_id(c, experiment),
                           tags={**system_tags(), **{k: str(v) for k, v in tags.items()}})
        if params:
            _log_params(c, run.info.run_id, params)
        return cls(uri, run.info.run_id)

    @classmethod
    def reopen(cls, uri: str, run_id: str) -> RunHandle:
        """An existing run, RUNNING again (a resumed job continues its metrics at their steps).

        Raises:
            InputError: no such run in the store.
        """
        try:
            client(uri).update_run(run_id, status="RUNNING")
        except mlflow.exceptions.MlflowException as exc:
            raise InputError(f"MLflow run {run_id!r} cannot be opened in {uri!r}: "
                             f"{str(exc).splitlines()[0][:300]}") from None
        return cls(uri, run_id)

    def tag(self, tags: dict[str, Any]) -> None:
        c = client(self.uri)
        for k, v in tags.items():
            c.set_tag(self.run_id, k, str(v)[:5000])

    def tags(self) -> dict[str, str]:
        return dict(client(self.uri).get_run(self.run_id).data.tags)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        ms = [mlflow.entities.Metric(k, float(v), now, int(step)) for k, v in metrics.items()]
        client(self.uri).log_batch(self.run_id, metrics=ms)

    def log_params(self, params: dict[str, Any]) -> None:
        """Params (an existing key may only be logged again with the same value)."""
        _log_params(client(self.uri), self.run_id, params)

    def log_artifacts(self, paths: Sequence[str | Path], under: str | None = None) -> None:
        """Files at the artifact root (or under ``under/``); a directory ``d`` goes under
        ``d.name/``."""
        c = client(self.uri)
        for p in paths:
            if Path(p).is_dir():
                c.log_artifacts(self.run_id, str(p), "/".join(x for x in (under, Path(p).name)
                                                              if x))
            else:
                c.log_artifact(self.run_id, str(p), under)

    def log_text(self, text: str, path: str) -> None:
        """``text`` as the artifact ``path`` (e.g. ``failure/worker-1.log``)."""
        client(self.uri).log_text(self.run_id, text, path)

    def log_model(self, export_dir: str | Path, example: Any, step: int) -> str:
        """``net.export``'s files in ``export_dir`` as the run's logged model
        (:func:`mxlarge.tracking.model.log_model`). Returns its model id."""
        return model.log_model(self.uri, self.run_id, export_dir, example, step)

    def last_step(self) -> int | None:
        """The last step of the run's training metrics (``train/loss``, ``train/samples``),
        None before any."""
        steps = [step for key in ("train/loss", "train/samples")
                 for step, _ in metric_history(self.uri, self.run_id, key)]
        return max(steps, default=None)

    def model_id(self) -> str | None:
        """The id of the run's newest logged model (its URI is ``models:/ID``), None if it
        has none."""
        return model.model_id(self.uri, self.run_id)

    def end(self, ok: bool, tags: dict[str, Any] | None = None,
            status: str | None = None) -> None:
        """FINISHED or FAILED (or ``status``, e.g. KILLED), after the given tags (e.g.
        ``failure``)."""
        self.tag(tags or {})
        client(self.uri).set_terminated(self.run_id,
                                        status=status or ("FINISHED" if ok else "FAILED"))

    def status(self) -> str:
        return client(self.uri).get_run(self.run_id).info.status


@dataclass(frozen=True)
class OpenRun:
    """The run a process logs into, as :func:`open_run` decided it, and whether this process
    ends it (``owned``: it opened or reopened the run; otherwise a caller did and ends it)."""

    run: RunHandle
    owned: bool

    def close(self, ok: bool, tags: dict[str, Any] | None = None,
              status: str | None = None) -> None:
        """The one place a process's run is ended: FINISHED or FAILED (or ``status``) after
        ``tags`` when this process owns it, else only the tags (the caller ends it)."""
        if self.owned:
            self.run.end(ok, tags, status)
        elif tags:
            self.run.tag(tags)


def open_run(cfg: Config, *, given: str | None, resumed: str | None, plan: Any,
             source: str | None, may_open: bool = True) -> OpenRun | None:
    """Which MLflow run this process logs into, decided once at its root; the training code
    receives the result.

    In order: the caller's run (``given``, i.e. ``--run-id``, else ``$MLFLOW_RUN_ID``: logged
    into, not ended here); else the run of the checkpoint being resumed (``resumed``, its
    ``run_id``: RUNNING again, so metrics continue at their steps); else a new run (named and
    described from ``plan`` and ``source``, :meth:`RunHandle.create`). ``None`` when tracking
    is off, or when no run is given and this process may not open one (``may_open`` false: a
    worker of rank > 0, whose rank 0 opens the job's run).

    Raises:
        InputError: ``given`` with tracking off; an unreachable store; a ``given`` or
            ``resumed`` run the store does not have (on reopening).
    """
    if not cfg.tracking.enabled:
        if given is not None:
            raise InputError(f"--run-id {given}: tracking.enabled is false")
        return None
    caller = caller_run_id(given, cfg)
    if caller is None and not may_open:
        return None
    uri = tracking_uri(cfg)
    check_reachable(uri)
    if caller is not None:
        return OpenRun(RunHandle(uri, caller), owned=False)
    if resumed:
        return OpenRun(RunHandle.reopen(uri, resumed), owned=True)
    return OpenRun(RunHandle.create(cfg, uri, plan=plan, source=source), owned=True)


def sweep_parent(uri: str, experiment: str, name: str, params: dict[str, Any] | None = None,
                 description: str = "") -> RunHandle:
    """The parent run of sweep ``name`` (tag ``sweep_parent``), reopened if a previous
    invocation made it (a resumed sweep keeps one parent), else created with ``params`` and
    ``description``."""
    found = find_runs(uri, experiment, {"sweep_parent": name})
    if found:
        return RunHandle.reopen(uri, found[0]["run_id"])
    return RunHandle.create_plain(uri, experiment, {"sweep_parent": name,
                                                    "mlflow.runName": f"sweep {name}",
                                                    "mlflow.note.content": description},
                                  params)


def find_sweep_parent(uri: str, experiment: str, name: str) -> RunHandle | None:
    """The parent run of sweep ``name`` if there is one (nothing is reopened or created)."""
    found = find_runs(uri, experiment, {"sweep_parent": name})
    return RunHandle(uri, found[0]["run_id"]) if found else None


def script_of(command: Sequence[str]) -> str:
    """The file name of a command's script: its first ``*.py`` argument (``python train.py``),
    else its program's name (``./train``); the module of ``python -m pkg.mod``."""
    for i, arg in enumerate(command):
        if arg.endswith(".py"):
            return Path(arg).name
        if arg == "-m" and i + 1 < len(command):
            return command[i + 1]
    return Path(command[0]).name if command else "command"


def open_command_run(command: Sequence[str], params: dict[str, Any], *,
                     experiment: str | None = None, name: str | None = None) -> OpenRun:
    """The run of a launched command of the user's own (``python -m mxlarge.launcher``),
    decided once at the launcher: ``$MLFLOW_RUN_ID``'s, MLflow's convention for attaching
    to a run (logged into, not ended here), else a new RUNNING run in
    ``$MLFLOW_TRACKING_URI`` (else ``./mlruns.db``) with ``params``; in ``experiment``,
    else ``$MLFLOW_EXPERIMENT_NAME``, else the script's file name (:func:`script_of`);
    named ``name``, else the script's file name, ``#2`` and on when taken.

    Raises:
        InputError: an unreachable store; an ``$MLFLOW_RUN_ID`` the store does not have.
    """
    cfg = Config()
    uri = tracking_uri(cfg)
    check_reachable(uri)
    caller = caller_run_id(None, cfg)
    if caller is not None:
        run = RunHandle(uri, caller)
        try:
            run.log_params(params)
        except mlflow.exceptions.MlflowException as exc:
            raise InputError(f"MLFLOW_RUN_ID={caller}: cannot log into it in {uri!r}: "
                             f"{str(exc).splitlines()[0][:300]}") from None
        return OpenRun(run, owned=False)
    script = script_of(command)
    exp = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or script
    c = client(uri)
    title = unique_run_name(c, experiment_id(c, exp), name or script)
    tags = {"mlflow.runName": title, "mlflow.source.name": script}
    return OpenRun(RunHandle.create_plain(uri, exp, tags, params), owned=True)
