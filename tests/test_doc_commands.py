"""Every shell command in README.md's and docs/*.md's code blocks runs, as written.

The rule:

* a command is a line of a fenced block marked ```bash, ```sh or ```console (in ```console
  only the lines starting with ``$ ``), lines ending in ``\\`` joined with the next; blank
  lines and lines that are only a comment are not commands;
* a command that cannot run here says so in the docs with the visible marker ``(needs: WHAT)``
  or ``needs: WHAT`` in its comment (root, the testbed, a cluster, a browser, minutes of
  training...); a comment line ``# needs: WHAT`` at the top of a block marks the whole block.
  Those are skipped here with the reason (they run in the tier that has them:
  ``make test-cluster``, ``make test-ui``, or they are the long runs and benchmarks);
* every other command runs, block by block in one shell (``. .venv/bin/activate`` carries to
  the next line), in a temporary directory holding a copy of ``experiments/``, the checkout's
  ``.venv`` and a ``train.py`` shaped like README's "Your own script" (the reader's own script
  that ``python -m mxlarge.launcher ... python train.py`` launches), so that the MLflow store
  (``./mlruns.db``), reports and checkpoints land there, not in the repository;
* at a short length: ``mxlarge train``, ``launch`` and ``sweep``, which take ``key=value``
  overrides (README "The command line", docs/cli.md), get :data:`SHORT` appended (later
  overrides win). So that the shortening hides nothing, each is first checked as written:
  ``mxlarge show`` with the same config and overrides (for ``launch -n K -s S``:
  ``dist.workers=K dist.servers=S``), ``mxlarge sweep ... --dry-run`` for a sweep.

The runs take about 90 s on 2 cores, so the test that runs them is marked ``slow``; the rule's
own checks (every command runnable or marked) are in the fast tier.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "console")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
NEEDS = re.compile(r"needs:\s*([^)\n]+)")
# the short length: one epoch (warmup and drops inside it), no progress bars, MNIST-1D's
# generated sets small (a multiple of 10, and above 16 simulated workers x 32)
SHORT = ["train.epochs=1", "optim.warmup_epochs=0.5", "optim.decay_epochs=[0.75]",
         "train.progress=false", "data.mnist1d_train=1100", "data.mnist1d_val=200"]
TRAIN_PY = '''"""README's "Your own script": a Gluon loop whose Trainer line is mxlarge's."""
import argparse

import mxnet as mx  # before anything else that needs it
from mxnet import autograd, gluon

import mxlarge

parser = argparse.ArgumentParser()
parser.add_argument("--kvstore", default="local")
args = parser.parse_args()
kv = mx.kv.create(args.kvstore)
mx.random.seed(kv.rank)  # each worker its own data
net = gluon.nn.Dense(2)
net.initialize(mx.init.Xavier())
trainer = mxlarge.Trainer(net.collect_params(), "nag", {"learning_rate": 0.1, "momentum": 0.9},
                          kvstore=kv, reference_batch=256, warmup_steps=500)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for step in range(3):
    x = mx.nd.random.uniform(shape=(8, 4))
    y = (x.sum(axis=1) > 2).astype("float32")
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(8)
print(f"worker {kv.rank} of {kv.num_workers}: 3 steps")
'''


@dataclass(frozen=True)
class Command:
    doc: str
    line: int      # of the command's first line in the doc
    text: str      # as written (continuations joined)
    needs: str     # the marker's reason, "" when it runs here


def blocks(doc: str) -> list[list[Command]]:
    """The shell commands of ``doc``'s code blocks, block by block, by the rule above."""
    text = (ROOT / doc).read_text()
    out = []
    for block in FENCE.finditer(text):
        kind = block.group(1)
        if kind not in SHELLS:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        found: list[Command] = []
        whole = ""  # the block's own marker
        pending: list[str] = []  # the lines of a command continued with a backslash
        start = 0
        for i, raw in enumerate(block.group(2).splitlines()):
            line = raw.strip()
            if kind == "console" and not pending:
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            if not pending and line.startswith("#"):
                m = NEEDS.search(line)
                if m and not found:  # at the block's top: marks the whole block
                    whole = m.group(1).strip()
                continue
            if not line:
                continue
            if not pending:
                start = i
            pending.append(line.rstrip("\\").rstrip())
            if line.endswith("\\"):
                continue
            joined = " ".join(pending)
            pending = []
            m = NEEDS.search(joined.partition(" #")[2])
            found.append(Command(doc, first + start, joined,
                                 m.group(1).strip() if m else whole))
        if found:
            out.append(found)
    return out


BLOCKS = [b for doc in DOCS for b in blocks(doc)]
ALL = [c for b in BLOCKS for c in b]


def _mxlarge(tokens: list[str]) -> str | None:
    """The verb of an ``mxlarge VERB ...`` command, else None."""
    if len(tokens) >= 2 and Path(tokens[0]).name == "mxlarge":
        return tokens[1]
    return None


def as_run(command: Command) -> tuple[list[str], str]:
    """(the commands that check it as written, the command at the short length)."""
    tokens = shlex.split(command.text, comments=True)
    verb = _mxlarge(tokens)
    if verb not in ("train", "launch", "sweep"):
        return [], command.text
    short = shlex.join(tokens + SHORT)
    args = tokens[2:]
    if verb == "sweep":
        return [shlex.join([*tokens, "--dry-run"])], short
    if verb == "launch":
        world = {"-n": "dist.workers", "-s": "dist.servers"}
        shown, i = [], 0
        while i < len(args):
            if args[i] in world:
                shown.append(f"{world[args[i]]}={args[i + 1]}")
                i += 2
            else:
                shown.append(args[i])
                i += 1
        args = shown
    return [shlex.join([tokens[0], "show", *args])], short


def test_the_commands_are_found_and_each_runs_or_says_what_it_needs():
    texts = [c.text for c in ALL]
    assert any("mxlarge train  experiments/proxy/digits-baseline.yaml" in t for t in texts)
    assert any("python -m mxlarge.launcher -n 2 -s 1 -- python train.py" in t for t in texts)
    needs = {c.text.split("#")[0].strip(): c.needs for c in ALL if c.needs}
    assert needs[".venv/bin/python -m mxlarge.testbed up"].startswith("root")  # block marker
    assert "browser" in needs[".venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns.db"]
    assert "ssh" in needs["mxlarge launch experiments/proxy/digits-largebatch.yaml -n 8 -s 4 "
                          "--launcher ssh -H hosts"]
    for c in ALL:
        tokens = shlex.split(c.text, comments=True)
        # usage notation is not a command: `[--json]` runs as a glob, not as an option
        assert not any(t.startswith("[-") for t in tokens), c
        if c.needs:
            continue
        assert tokens[0] not in ("make", "salloc", "sudo"), f"{c}: runnable? else mark it"


def test_short_runs_check_the_command_as_written():
    launch = Command("x", 1, "mxlarge launch a.yaml -n 2 -s 1 k=v   # c", "")
    assert as_run(launch) == (["mxlarge show a.yaml dist.workers=2 dist.servers=1 k=v"],
                              shlex.join(["mxlarge", "launch", "a.yaml", "-n", "2", "-s", "1",
                                          "k=v", *SHORT]))
    sweep = Command("x", 1, "mxlarge sweep s.yaml --part 1/2", "")
    assert as_run(sweep)[0] == ["mxlarge sweep s.yaml --part 1/2 --dry-run"]
    show = Command("x", 1, "mxlarge show a.yaml --lr-at 0,10   # what", "")
    assert as_run(show) == ([], show.text)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID",
                        "VIRTUAL_ENV")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b[0].doc}:{b[0].line}" for b in BLOCKS])
def test_every_doc_command_runs(block, tmp_path):
    runnable = [c for c in block if not c.needs]
    if not runnable:
        pytest.skip("; ".join(sorted({f"needs: {c.needs}" for c in block})))
    shutil.copytree(ROOT / "experiments", tmp_path / "experiments")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "train.py").write_text(TRAIN_PY)
    script = ["set -e"]
    for c in runnable:
        checks, short = as_run(c)
        for line in [*checks, short]:
            script += [f"echo {shlex.quote(f'>>> {c.doc}:{c.line}: {line}')}", line]
    r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    skipped = [c for c in block if c.needs]
    if skipped:
        print("skipped:", *(f"{c.doc}:{c.line} (needs: {c.needs})" for c in skipped))
