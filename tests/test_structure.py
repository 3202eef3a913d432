"""The shape of the package: no import cycle, leaves that stay leaves, one owner per fact."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mxlarge"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """``module -> modules of the same package it imports`` (anywhere in the file, functions
    included; ``from pkg import name`` counts as ``pkg.name`` when that is a module)."""
    files = {_module(p): p for p in pkg.rglob("*.py")}
    top = pkg.name
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith(top)}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(top):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    deps.add(sub if sub in files else node.module)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_mxlarge():
    assert find_cycle(import_graph()) is None


def test_no_import_cycle_in_benchmarks():
    assert find_cycle(import_graph(PKG.parent / "benchmarks")) is None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def _is_launcher(module: str) -> bool:
    return module == "mxlarge.launcher" or module.startswith("mxlarge.launcher.")


# The training code: what runs inside a worker. None of it may reach the launcher.
TRAINING = ("mxlarge.trainer", "mxlarge.run", "mxlarge.loop", "mxlarge.plan", "mxlarge.hooks",
            "mxlarge.checkpoint", "mxlarge.bnstats", "mxlarge.gns", "mxlarge.resume")
TRAINING_PACKAGES = ("mxlarge.kvstore", "mxlarge.schedulers", "mxlarge.nets", "mxlarge.data",
                     "mxlarge.protocol", "mxlarge.tracking", "mxlarge.config")
# What may import the launcher: the front ends that turn argv into a job (and the sweep, which
# runs cells through `mxlarge launch`).
FRONT_ENDS = {"mxlarge.cli", "mxlarge.launch_cli", "mxlarge.sweep"}


def test_reachable_follows_imports_through_others():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"b", "c"}


def test_training_code_imports_nothing_of_the_launcher():
    """The launcher is on top of the training code, not under it: the worker side of the job
    protocol (heartbeats, fail-fast) lives in ``mxlarge.protocol``, which both import."""
    g = import_graph()
    training = [m for m in g if m in TRAINING
                or any(m == p or m.startswith(p + ".") for p in TRAINING_PACKAGES)]
    assert {"mxlarge.trainer", "mxlarge.kvstore.sync", "mxlarge.nets.init",
            "mxlarge.data.sharding", "mxlarge.schedulers", "mxlarge.protocol.heartbeat"} \
        <= set(training)
    for m in training:
        up = sorted(d for d in reachable(g, m) if _is_launcher(d) or d in FRONT_ENDS)
        assert up == [], f"{m} reaches {up}"


def test_the_launcher_is_on_top():
    """Only the launcher itself and the front ends import it; the protocol is a leaf."""
    g = import_graph()
    importers = sorted(m for m, deps in g.items()
                       if not _is_launcher(m) and any(_is_launcher(d) for d in deps))
    assert set(importers) <= FRONT_ENDS, importers
    protocol = [m for m in g if m.startswith("mxlarge.protocol.")]
    assert {d for m in protocol for d in g[m]} <= set(protocol)
    assert g["mxlarge.protocol.heartbeat"] == set()
    assert "mxlarge.protocol.session" in g["mxlarge.trainer"]
    assert "mxlarge.protocol.heartbeat" in g["mxlarge.launcher.watchdog"]


def test_schedulers_and_plan_leaves():
    g = import_graph()
    assert g["mxlarge.schedulers"] == set()
    assert g["mxlarge.hooks"] == set()


def test_config_layers():
    """The schema knows no loader; the rules and the export read only the schema; the loader
    the schema and the rules."""
    g = import_graph()
    config = {m: {d for d in deps if d.startswith("mxlarge.config")}
              for m, deps in g.items() if m.startswith("mxlarge.config.")}
    assert config == {"mxlarge.config.schema": set(),
                      "mxlarge.config.rules": {"mxlarge.config.schema"},
                      "mxlarge.config.export": {"mxlarge.config.schema"},
                      "mxlarge.config.loader": {"mxlarge.config.schema", "mxlarge.config.rules"}}


def test_report_does_not_import_mxnet():
    code = ("import sys, mxlarge.reporting.cli, mxlarge.tracking; "
            "print('mxnet' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_reporting_is_one_room():
    """Every plot is drawn in ``reporting/plots.py`` (the only matplotlib import), and of the
    reporting modules only the MLflow reads (``store``) and the verb (``cli``) reach
    ``mxlarge.tracking``: the arithmetic, the tables and the plots work on plain records."""
    users = sorted(_module(p) for p in PKG.rglob("*.py")
                   if re.search(r"^\s*(import matplotlib|from matplotlib)", p.read_text(), re.M))
    assert users == ["mxlarge.reporting.plots"]
    g = import_graph()
    room = sorted(m for m in g if m.startswith("mxlarge.reporting."))
    assert {f"mxlarge.reporting.{m}" for m in ("runs", "store", "summary", "study", "tables",
                                               "plots", "cli")} <= set(room)
    reading = sorted(m for m in room if any(_in_tracking(d) for d in reachable(g, m)))
    assert reading == ["mxlarge.reporting.cli", "mxlarge.reporting.store"]


def _in_tracking(module: str) -> bool:
    return module == "mxlarge.tracking" or module.startswith("mxlarge.tracking.")


def test_mlflow_is_imported_in_one_package_only():
    """``mlflow`` is imported under ``mxlarge/tracking/`` only (``gluon_pyfunc``, the loader
    copied into each logged model, imports neither MLflow nor mxlarge)."""
    users = sorted(_module(p) for p in PKG.rglob("*.py")
                   if re.search(r"^\s*(import mlflow|from mlflow)", p.read_text(), re.M))
    assert users and all(_in_tracking(u) for u in users), users


def test_tracking_imports_nothing_of_reporting():
    """Reporting reads the runs through tracking, never the other way round: the hook's plot
    function is passed in by whoever builds it (imports inside functions count too)."""
    g = import_graph()
    tracking = sorted(m for m in g if _in_tracking(m))
    assert {"mxlarge.tracking", "mxlarge.tracking.hook", "mxlarge.tracking.run"} <= set(tracking)
    up = {m: sorted(d for d in g[m] if d == "mxlarge.reporting"
                    or d.startswith("mxlarge.reporting.")) for m in tracking}
    assert {m: d for m, d in up.items() if d} == {}


def test_the_run_identity_is_passed_not_read_from_the_environment():
    for p in PKG.rglob("*.py"):
        text = p.read_text()
        assert "MXLARGE_RUN_ID" not in text, p
        assert "os.environ[" not in text, p


def test_kvstore_push_and_pull_happen_in_sync_py_only():
    """README: `kvstore/sync.py` is the only push/pull (and the only `mx.kv.create`)."""
    users = sorted(_module(p) for p in PKG.rglob("*.py")
                   if re.search(r"\.(push|pull|pushpull|broadcast)\(|kv\.create\(", p.read_text()))
    assert users == ["mxlarge.kvstore.sync"]


def test_nothing_outside_tests_imports_tests():
    """Test fixtures that benchmarks or the product need live in the product (the testbed in
    ``mxlarge.testbed``, tiny datasets in ``mxlarge.data.tiny``)."""
    root = PKG.parent
    users = []
    for folder in ("mxlarge", "benchmarks"):
        for p in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(n == "tests" or n.startswith("tests.") for n in names):
                    users.append(str(p.relative_to(root)))
    assert users == []


def test_a_training_run_is_decided_in_open_run_only():
    """Which MLflow run a training process logs into is decided in ``tracking.open_run`` (called
    at the process roots: ``mxlarge launch``, ``run.train``) and ended in ``OpenRun.close``; a
    sweep's cell and parent runs and a report's run are their own (made by ``sweep`` and
    ``report``)."""
    deciders = sorted(_module(p) for p in PKG.rglob("*.py")
                      if re.search(r"RunHandle\.(create|reopen)\(|caller_run_id\(",
                                   p.read_text()) and not _in_tracking(_module(p)))
    assert deciders == ["mxlarge.sweep"]
    callers = sorted(_module(p) for p in PKG.rglob("*.py") if "open_run(" in p.read_text())
    assert callers == ["mxlarge.launch_cli", "mxlarge.run", "mxlarge.tracking.run"]


# The modules that may test a backend's name: the backends themselves. Everything else asks
# the backend object (mxlarge/launcher/registry.py looks it up by name, from a dict).
BACKEND_MODULES = "mxlarge/launcher/backends/"
_NAME_BRANCH = re.compile(r"""launcher\s*(==|!=)|(==|!=)\s*["'](ssh|mpi|slurm)["']|"""
                          r"""launcher\s+(not\s+)?in\s*[(\[{]""")


def test_no_backend_name_branching_outside_the_backend_modules():
    """One class per backend (mxlarge/launcher/backends/): no `launcher == "ssh"` and the like
    anywhere else in the package."""
    found = [f"{p.relative_to(PKG.parent)}:{n}: {line.strip()}"
             for p in sorted(PKG.rglob("*.py"))
             if not str(p.relative_to(PKG.parent)).startswith(BACKEND_MODULES)
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if _NAME_BRANCH.search(line)]
    assert found == []


def test_the_name_branching_check_catches_the_forms_it_is_for():
    for line in ('if launcher == "ssh":', "if self.launcher != 'local':", 'x == "mpi"',
                 'if args.launcher in ("local", "ssh"):', 'launcher not in ["slurm"]'):
        assert _NAME_BRANCH.search(line), line
    for line in ('if mode == "local":', 'name in REGISTRY', 'launcher_of(argv) == "local"'):
        assert not _NAME_BRANCH.search(line), line


#: The most lines a module of mxlarge/ has without saying in its docstring why it needs more.
MAX_LINES = 500


def test_no_module_is_over_max_lines():
    """No module of mxlarge/ is over MAX_LINES lines: a longer one is split, not excused."""
    long = [f"{p.relative_to(PKG.parent)}: {n} lines" for p in sorted(PKG.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert long == []


def test_the_trainer_is_thin():
    """The Trainer keeps Gluon's surface and the step and delegates the rest: its class at
    most 300 lines, its ``__init__`` body at most 40, and trainer/ talks to the store through
    its methods (at most 6 ``self.store.`` in the package; no derived state read back)."""
    tree = ast.parse((PKG / "trainer" / "__init__.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assert cls.end_lineno - cls.lineno + 1 <= 300
    assert init.end_lineno - init.body[0].lineno + 1 <= 40
    text = "".join(p.read_text() for p in (PKG / "trainer").glob("*.py"))
    assert text.count("self.store.") <= 6
    assert not re.search(r"store\.(grads_version|pushed|stats)\b", text)


def test_the_supervisor_is_public():
    """The launcher's heart has a public name: no module named `_supervise` (it is
    mxlarge/launcher/supervisor.py)."""
    assert [p for p in PKG.rglob("_supervise.py")] == []
    assert (PKG / "launcher" / "supervisor.py").is_file()


#: The hooks DmlcBackend.run calls, in their order (docs/design/launcher.md).
DMLC_HOOKS = ("check_hosts", "check_words", "prepare", "layout", "used_hosts")


def test_dmlc_run_is_a_template_method():
    """`DmlcBackend.run` calls its hooks in order, in code; no dmlc backend overrides it."""
    import inspect

    from mxlarge.launcher.backends.dmlc import DmlcBackend
    from mxlarge.launcher.registry import REGISTRY

    source = inspect.getsource(DmlcBackend.run)
    at = [source.find(f"self.{hook}(") for hook in DMLC_HOOKS]
    assert -1 not in at and at == sorted(at), dict(zip(DMLC_HOOKS, at))
    dmlc = [c for c in REGISTRY.values() if issubclass(c, DmlcBackend)]
    assert len(dmlc) == 3 and all("run" not in vars(c) for c in dmlc)


def test_tests_mirror_the_package():
    """Tests of a package of mxlarge/ live in the folder of its name, and the scripts tests run
    as processes in tests/scripts/: the root holds only tests of top-level modules."""
    tests = PKG.parent / "tests"
    loose = sorted(p.name for p in tests.glob("*.py")
                   if not p.name.startswith("test_")
                   and p.name not in ("__init__.py", "conftest.py", "helpers.py"))
    assert loose == []
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    for p in tests.glob("test_*.py"):
        assert p.stem.removeprefix("test_") not in packages, f"{p.name} belongs in tests/" \
            f"{p.stem.removeprefix('test_')}/"
    for folder in ("kvstore", "trainer", "launcher", "protocol", "tracking", "config"):
        assert any((tests / folder).glob("test_*.py")), folder
