"""docs/config.md, rendered from the schema: every key with its default, the values it accepts,
when it takes effect and what it means.

Nothing in the page is written per key: the defaults, types and ranges are the ``_f`` fields of
:mod:`.schema`, the meaning is the doc string ``mxlarge show --explain KEY`` prints, and "takes
effect" joins the key's :func:`.export.scope` (a dataset or model its doc names) and its
``when`` condition (the rule the run's MLflow params follow). ``python -m
mxlarge.config.reference --write`` writes the page; ``--check`` exits 1 when it is stale, as
``tests/config/test_reference.py`` fails then and when a key has no description.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxlarge.config.export import fields_of, scope
from mxlarge.config.loader import describe_type, rules_text
from mxlarge.config.schema import Config

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"
COMMAND = "python -m mxlarge.config.reference --write"
#: The column prose wraps at (pyproject.toml's MD013 ``line_length``); table rows are one line.
WIDTH = 100

INTRO = """\
# Config reference

<!-- Generated from mxlarge/config/schema.py by `{command}`:
do not edit by hand. -->

{sections}
Each section maps keys to values, and a key left out keeps its default.
The shipped experiments are in `experiments/`, e.g. `experiments/proxy/digits-largebatch.yaml`.
A small one:

```yaml
name: my-experiment
data: {{dataset: digits, batch_size: 32}}
optim: {{base_lr: 0.1, reference_batch: 256, warmup_epochs: 5}}
train: {{epochs: 90}}
```

The loader is strict.
An unknown key, a wrong type or a value out of range stops the command with exit status 2.
The message names the file, the key, the value and what was expected.
The loader also refuses some combinations of keys, e.g. `optim.lars` without `optim.lars_lr`.
Those rules and their reasons are in
[the config's cross-field rules](design/config.md#the-cross-field-rules).

## Overrides and `--explain`

`train`, `launch`, `sweep` and `show` take `key=value` overrides after the config file.
An example is `mxlarge show CONFIG optim.base_lr=0.2 'optim.decay_epochs=[30,60]'`.
Each value is read as YAML, and the same checks apply as in the file.
`mxlarge show CONFIG key=value ...` prints the resolved config and the plan that will run.
`mxlarge show --explain KEY` prints one key's meaning and default, e.g. `--explain optim.base_lr`.
The [command line](cli.md) describes the verbs.

## Reading the tables

There is one table per section, with the keys in the schema's order.
The default is written as YAML.
*Accepted* is what the loader takes for the key.
*Takes effect* says when the key changes anything.
Only keys that take effect are logged as the run's MLflow params ([mlflow.md](mlflow.md)).
*Meaning* is the text that `--explain` prints.
What the world makes of a config (global batch, peak LR, steps) is decided in `mxlarge/plan.py`.
This page lists {count} keys.
"""


def undocumented(node: Any = None) -> list[str]:
    """The keys of ``node`` (default: :class:`Config`) whose field has no description."""
    return [key for key, f in fields_of(node) if not str(f.metadata.get("doc", "")).strip()]


def _yaml(value: Any) -> str:
    """A default as YAML spells it in a file: ``true``, ``null``, ``[30.0, 60.0]``."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def accepted(tp: Any, meta: dict) -> str:
    """What the loader takes for a field of type ``tp`` with rules ``meta``: ``an integer >=
    1``, ``one of [linear, sqrt, none]``, ``null or a number > 0``, ``a list of 2 numbers, each
    > 0 and <= 1``."""
    nullable = typing.get_origin(tp) in (typing.Union, types.UnionType)
    if nullable:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    rules = rules_text(meta)
    if meta.get("choices") is not None:
        text = "one of [" + ", ".join(map(_yaml, meta["choices"])) + "]"
    elif rules and typing.get_origin(tp) is tuple:
        text = f"{describe_type(tp)}, each {rules}"
    else:
        text = f"{describe_type(tp)} {rules}".strip()
    return f"null or {text}" if nullable else text


def takes_effect(key: str, meta: dict) -> str:
    """When ``key`` changes anything, in words: its dataset or model and its ``when``."""
    found = [c for c in (scope(key), meta.get("when")) if c is not None]
    if not found:
        return "always"
    if len(found) == 1:
        return str(found[0])
    return str(found[0] & found[1])


def _cell(text: str) -> str:
    """Text for one table cell: one line, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _wrap(text: str) -> str:
    """Prose wrapped at the page's width (Markdown lint's MD013), never inside a word."""
    return textwrap.fill(" ".join(text.split()), WIDTH, break_long_words=False,
                         break_on_hyphens=False)


def _doc(cls: type) -> str:
    return _wrap(inspect.cleandoc(cls.__doc__ or ""))


def _table(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    defaults = cls()
    rows = ["| key | default | accepted | takes effect | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) or f.metadata.get("internal"):
            continue
        key = prefix + f.name
        meta = dict(f.metadata)
        cells = [f"`{key}`", f"`{_yaml(getattr(defaults, f.name))}`",
                 accepted(hints[f.name], meta), takes_effect(key, meta),
                 str(meta.get("doc", ""))]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def render() -> str:
    """docs/config.md as the schema makes it."""
    hints = typing.get_type_hints(Config)
    sections = [f for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])]
    links = ", ".join(f"[{f.name}](#{f.name})" for f in sections)
    count = sum(1 for _ in fields_of())
    intro = _wrap(f"An experiment is one YAML file. It has a `name` and up to six sections: "
                  f"{links}.")
    out = [INTRO.format(command=COMMAND, sections=intro, count=count)]
    out += ["## The top level", "", _doc(Config), "", *_table(Config, ""), ""]
    for f in sections:
        cls = hints[f.name]
        out += [f"## {f.name}", "", _doc(cls), "", *_table(cls, f"{f.name}."), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxlarge.config.reference",
                                description="docs/config.md from the config schema (default: "
                                            "print it)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the page")
    mode.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    p.add_argument("--page", type=Path, default=PAGE, help=f"the page (default: {PAGE})")
    args = p.parse_args(argv)
    page = render()
    if args.write:
        args.page.write_text(page)
        return 0
    if not args.check:
        sys.stdout.write(page)
        return 0
    old = args.page.read_text() if args.page.is_file() else ""
    if old == page:
        return 0
    diff = list(difflib.unified_diff(old.splitlines(), page.splitlines(), str(args.page),
                                     "the schema's", lineterm="", n=0))
    print(f"{args.page} is stale: run {COMMAND}", *diff[:40], sep="\n", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
