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
            "mxlarge.persist", "mxlarge.checkpoint", "mxlarge.bnstats", "mxlarge.gns",
            "mxlarge.resume")
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
    the schema and the rules; the reference page's generator the schema, the export and the
    loader's words for types and ranges."""
    g = import_graph()
    config = {m: {d for d in deps if d.startswith("mxlarge.config")}
              for m, deps in g.items() if m.startswith("mxlarge.config.")}
    assert config == {"mxlarge.config.schema": set(),
                      "mxlarge.config.rules": {"mxlarge.config.schema"},
                      "mxlarge.config.export": {"mxlarge.config.schema"},
                      "mxlarge.config.loader": {"mxlarge.config.schema", "mxlarge.config.rules"},
                      "mxlarge.config.reference": {"mxlarge.config.schema", "mxlarge.config.export",
                                                   "mxlarge.config.loader"}}


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


def _classes(pkg: Path = PKG) -> list[tuple[str, str]]:
    """``(class name, module)`` of every class defined in the package, nested ones included."""
    return [(node.name, _module(p)) for p in sorted(pkg.rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ClassDef)]


def test_no_two_classes_share_a_name():
    """One name, one meaning: a reader who meets ``Beat`` or ``Window`` knows which one."""
    seen: dict[str, list[str]] = {}
    for name, module in _classes():
        seen.setdefault(name, []).append(module)
    shared = {name: modules for name, modules in seen.items() if len(modules) > 1}
    assert shared == {}


#: What a step's instrumentation is: the modules that watch a step. The step path reaches them
#: only through the observer seam (``mxlarge.observers``).
INSTRUMENTATION = ("mxlarge.protocol.heartbeat", "mxlarge.timeline.record",
                   "mxlarge.breakdown", "mxlarge.observers.heartbeat",
                   "mxlarge.observers.timer")
#: The step path: the Trainer, the loop, the store.
STEP_PATH = ("mxlarge.trainer", "mxlarge.loop")


def _on_step_path(module: str) -> bool:
    return module in STEP_PATH or module.startswith("mxlarge.kvstore")


def test_the_step_path_reaches_its_instrumentation_only_through_the_seam():
    """The Trainer, the loop and the store import neither the heartbeat, nor the timeline's
    recorder, nor the breakdown: they tell ``mxlarge.observers`` what happens, and the
    observers (made in one place, ``mxlarge.observers.worker``) do the rest."""
    g = import_graph()
    step_path = sorted(m for m in g if _on_step_path(m))
    assert {"mxlarge.trainer", "mxlarge.loop", "mxlarge.kvstore.sync"} <= set(step_path)
    for m in step_path:
        assert g[m].isdisjoint(INSTRUMENTATION), (m, sorted(g[m] & set(INSTRUMENTATION)))
        assert "mxlarge.timeline" not in g[m] or m == "mxlarge.trainer.settings", m
    assert "mxlarge.observers" in g["mxlarge.trainer"]
    assert "mxlarge.observers" in g["mxlarge.kvstore.sync"]


def test_only_observers_import_the_recorder_and_the_timers():
    """The timeline's recorder and the observers themselves are made in one place; the
    breakdown's arithmetic is read by its observer, by the run that registers its hook and by
    an own script's run (its part names)."""
    g = import_graph()

    def importers(module: str) -> list[str]:
        return sorted(m for m, deps in g.items() if module in deps)
    assert importers("mxlarge.timeline.record") == ["mxlarge.observers.worker"]
    assert importers("mxlarge.observers.timer") == ["mxlarge.observers.worker"]
    assert importers("mxlarge.observers.heartbeat") == ["mxlarge.observers.worker"]
    assert importers("mxlarge.breakdown") == ["mxlarge.observers.timer",
                                              "mxlarge.reporting.plots", "mxlarge.run",
                                              "mxlarge.tracking.script"]
    assert importers("mxlarge.timeline.trace") == ["mxlarge.launcher.reports"]
    assert g["mxlarge.observers"] == set()


def test_the_store_reads_no_recorder_and_branches_on_no_wire():
    """What travels is the job's ``Wire`` (``kvstore/wires.py``), chosen once; the store
    moves what the wire hands it and tells its observers of each bucket in a marked step."""
    tree = ast.parse((PKG / "kvstore" / "sync.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert names.isdisjoint({"timeline", "recorder", "Recorder", "wire16", "_bit", "_wire",
                             "Float16Wire", "TwoBitWire"}), names
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    strings = {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant)
               and isinstance(c.value, str) and id(c) not in docstrings}
    assert "2bit" not in strings
    tree = ast.parse((PKG / "kvstore" / "wires.py").read_text())
    wires = {n.name for n in tree.body if isinstance(n, ast.ClassDef)
             and any(isinstance(b, ast.Name) and b.id == "Wire" for b in n.bases)}
    assert wires == {"Float32Wire", "Float16Wire", "TwoBitWire"}


def test_one_engine_mark_helper():
    """"Wait until the engine reaches this array" is ``mxlarge/engine.py``'s, nowhere else's:
    no other module slices an array's first element or waits on a thread of its own for it."""
    users = sorted(_module(p) for p in PKG.rglob("*.py")
                   if re.search(r"reshape\(\(-1,\)\)\[0:1\]|slice_axis\(", p.read_text()))
    assert users == ["mxlarge.engine"]


#: Objects that belong to someone else: an assignment to one of their attributes from outside
#: changes another object's behaviour behind its back.
COLLABORATORS = {"loop", "trainer", "store", "observers", "collectives", "timeline",
                 "heartbeat", "recorder"}


def _injections(tree: ast.AST) -> list[str]:
    """``x.store.timeline = ...`` and ``loop.timed = ...``: assignments to an attribute of a
    collaborator (:data:`COLLABORATORS`), by name or as an attribute of ``self``."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if not isinstance(t, ast.Attribute):
                continue
            owner = t.value
            if isinstance(owner, ast.Name) and owner.id in COLLABORATORS or \
                    isinstance(owner, ast.Attribute) and owner.attr in COLLABORATORS:
                found.append(ast.unparse(t))
    return found


def test_no_object_is_changed_through_another():
    """Observers are given to the constructor and called by their owner: nothing sets
    ``store.timeline`` or ``loop.timed`` from outside."""
    assert _injections(ast.parse("self.store.timeline = rec\nloop.timed = True\n"
                                 "self.x = 1\nself.updater.num_update = 3\n")) == \
        ["self.store.timeline", "loop.timed"]
    found = {_module(p): _injections(ast.parse(p.read_text())) for p in PKG.rglob("*.py")}
    assert {m: f for m, f in found.items() if f} == {}


def _statements(tree: ast.AST) -> tuple[list[int], list[int], list[int]]:
    """Line numbers of chained assignments (``a = b = 0``), parallel ones (``a, b = 1, 2``)
    and booleans used as statements (``x is None or x.update()``)."""
    chained, parallel, booleans = [], [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            if len(node.targets) > 1:
                chained.append(node.lineno)
            elif isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                parallel.append(node.lineno)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.BoolOp):
            booleans.append(node.lineno)
    return chained, parallel, booleans


def test_one_assignment_a_line_and_a_branch_as_an_if():
    """Written for the reader: one assignment a line, a branch as an ``if`` (unpacking what a
    call returns is one assignment)."""
    sample = "a = b = 0\nx, y = 1, 2\nq, r = divmod(7, 2)\nok or fail()\n"
    assert _statements(ast.parse(sample)) == ([1], [2], [4])
    found = {}
    for p in sorted(PKG.rglob("*.py")):
        lines = _statements(ast.parse(p.read_text()))
        if any(lines):
            found[_module(p)] = lines
    assert found == {}


def test_the_trainer_talks_to_the_store_through_its_methods():
    """trainer/ reads no derived state of the store back (the store tells through its
    ``on_grads`` callback and its plan)."""
    text = "".join(p.read_text() for p in (PKG / "trainer").glob("*.py"))
    assert not re.search(r"store\.(grads_version|pushed|stats|buckets|wire)\b", text)


def test_the_supervision_state_is_explicit_and_reports_have_one_reader():
    """The supervision loop moves through ``JobState`` and asks the watchdog for stalls only;
    stragglers and the timeline come from ``WorkerReports``, which reads beside it."""
    from mxlarge.launcher.supervisor import JobState

    assert [s.name for s in JobState] == ["RUNNING", "ENDING"]
    g = import_graph()
    assert "mxlarge.launcher.straggler" not in g["mxlarge.launcher.supervisor"]
    assert "mxlarge.launcher.straggler" in g["mxlarge.launcher.reports"]
    text = (PKG / "launcher" / "supervisor.py").read_text()
    assert ".seen" not in text


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


def test_the_architecture_page_names_every_module():
    """docs/architecture.md lists every module (a new one is added there with its line)."""
    page = (PKG.parent / "docs" / "architecture.md").read_text()
    missing = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG)
        named = f"`{rel.name}`" in page or f" {rel.name}" in page or f"`{rel}`" in page
        folders = all(f"{part}/" in page for part in rel.parts[:-1])
        if not (named and folders):
            missing.append(str(rel))
    assert missing == []
