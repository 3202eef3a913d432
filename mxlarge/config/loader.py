"""The strict loader: YAML files and ``key=value`` overrides into :mod:`.schema`'s dataclasses.

An unknown key (with the nearest valid one suggested), a wrong type or an out-of-range value is
one :class:`~.schema.ConfigError` line naming the file, the key path, the value and what was
expected; overrides go through the same checks. Any YAML file made of such dataclasses loads the
same way (:func:`load_dataclass`, e.g. a sweep file: a section may be a list of mappings,
``tuple[Dataclass, ...]``; a field without a default is required). An experiment config is
then checked across fields by :func:`.rules.validate`.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from mxlarge.config.rules import validate
from mxlarge.config.schema import Config, ConfigError
from mxlarge.errors import closest


def describe_type(tp: Any) -> str:
    """A field's type as the errors and docs/config.md say it: ``an integer``, ``a list of 2
    numbers``, ``a string or null``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return f"{describe_type(inner[0])} or null"
    if origin is tuple:
        noun = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}[args[0]]
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {noun}"
        return f"a list of {len(args)} {noun}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def rules_text(meta: dict) -> str:
    """A field's range rules in symbols: ``>= 0 and < 1``; empty without any."""
    parts = []
    for key, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if key in meta:
            parts.append(f"{sym} {meta[key]}")
    return " and ".join(parts)


_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _dataclass_items(tp: Any) -> type | None:
    """The item class of ``tuple[SomeDataclass, ...]``, else None."""
    args = typing.get_args(tp)
    if (typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis
            and isinstance(args[0], type) and dataclasses.is_dataclass(args[0])):
        return args[0]
    return None


class _Loader:
    def __init__(self, source: str):
        self.source = source

    def error(self, path: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path} = {value!r}: expected {expected}")

    def scalar(self, tp: Any, value: Any, path: str, meta: dict) -> Any:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            if value is None:
                return None
            inner = [a for a in args if a is not type(None)][0]
            return self.scalar(inner, value, path, meta)
        if origin is tuple:
            if not isinstance(value, (list, tuple)):
                raise self.error(path, value, describe_type(tp))
            item_tp = args[0]
            if not (len(args) == 2 and args[1] is Ellipsis) and len(value) != len(args):
                raise self.error(path, value, describe_type(tp))
            return tuple(self.scalar(item_tp, v, f"{path}[{i}]", meta) for i, v in enumerate(value))
        if tp is bool:
            if not isinstance(value, bool):
                raise self.error(path, value, "true or false")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(path, value, "an integer" + self._range(meta))
            out: Any = value
        elif tp is float:
            # YAML 1.1 reads 5e-4 and 1e-4 (no dot) as strings: accept what a user means
            if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
                value = float(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.error(path, value, "a number" + self._range(meta))
            out = float(value)
            if not math.isfinite(out):
                raise self.error(path, value, "a finite number")
        elif tp is str:
            if not isinstance(value, str):
                raise self.error(path, value, "a string")
            out = value
        else:  # pragma: no cover - guarded by the schema
            raise TypeError(tp)
        self.check_rules(out, path, meta, shown=value)
        return out

    @staticmethod
    def _range(meta: dict) -> str:
        text = rules_text(meta)
        return f" {text}" if text else ""

    def check_rules(self, value: Any, path: str, meta: dict, shown: Any = None) -> None:
        shown = value if shown is None else shown  # the value as written, e.g. 0 not 0.0
        choices = meta.get("choices")
        if choices is not None and value not in choices:
            raise self.error(path, shown, "one of " + ", ".join(map(str, choices)))
        for key, ok in (("ge", lambda v, b: v >= b), ("gt", lambda v, b: v > b),
                        ("le", lambda v, b: v <= b), ("lt", lambda v, b: v < b)):
            if key in meta and not ok(value, meta[key]):
                raise self.error(path, shown, f"{describe_type(type(value))} {rules_text(meta)}")

    def section(self, cls: type, data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise self.error(path or "<top level>", data, "a mapping of keys to values")
        hints = typing.get_type_hints(cls)
        # fields marked internal are set by code, never read from a file
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
        kwargs = {}
        for key, value in data.items():
            full = f"{path}.{key}" if path else str(key)
            if key not in fields:
                raise ConfigError(f"{self.source}: unknown key '{full}'" + self._suggest(
                    str(key), list(fields), path))
            tp = hints[key]
            item = _dataclass_items(tp)
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a class, not an instance
                kwargs[key] = self.section(tp, value, full)
            elif item is not None:
                if not isinstance(value, list) or not value:
                    keys = ", ".join(f.name for f in dataclasses.fields(item))
                    raise self.error(full, value, f"a non-empty list of mappings ({keys})")
                kwargs[key] = tuple(self.section(item, v, f"{full}[{i}]")
                                    for i, v in enumerate(value))
            else:
                kwargs[key] = self.scalar(tp, value, full, dict(fields[key].metadata))
        for name, f in fields.items():
            if (name not in kwargs and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING):
                full = f"{path}.{name}" if path else name
                raise ConfigError(f"{self.source}: missing key '{full}'")
        return cls(**kwargs)

    @staticmethod
    def _suggest(key: str, names: list[str], path: str) -> str:
        close = closest(key, names)
        if not close:
            where = f"'{path}'" if path else "the top level"
            return f" (valid keys in {where}: {', '.join(names)})"
        full = f"{path}.{close[0]}" if path else close[0]
        return f" (did you mean '{full}'?)"


def _set_path(tree: dict, dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: typing.Sequence[str]) -> list[tuple[str, Any]]:
    """Parses ``key.path=value`` strings; values are YAML scalars or flow lists."""
    out = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"override {item!r}: expected KEY.PATH=VALUE, e.g. optim.base_lr=0.2")
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        out.append((key, value))
    return out


def config_from_dict(tree: dict, source: str = "<dict>") -> Config:
    """Builds and validates a :class:`Config` from a nested dict."""
    cfg = _Loader(source).section(Config, tree, "")
    validate(cfg, source)
    return cfg


def load_dataclass(cls: type, tree: Any, source: str) -> Any:
    """Strictly loads any dataclass written with this module's field rules (e.g. a sweep file).

    Raises:
        ConfigError: naming the file, the key path, the value and what was expected.
    """
    return _Loader(source).section(cls, tree, "")


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Parses a YAML file; a missing file or malformed YAML is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what} file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from None


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Loads an experiment YAML strictly, applies ``key=value`` overrides, validates.

    Raises:
        ConfigError: naming the file, key path, value and what was expected.
    """
    path = Path(path)
    tree = read_yaml(path)
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, "
                          f"got {type(tree).__name__}")
    source = str(path)
    parsed = parse_overrides(overrides)
    for key, value in parsed:
        _set_path(tree, key, value, f"{path} (override {key}={value!r})")
    if parsed:
        source += " with overrides " + " ".join(overrides)
    return config_from_dict(tree, source)
