"""A config as data: plain YAML-able dicts, dotted keys, its YAML and hash, each field's doc.

``flatten`` gives the MLflow params, ``config_sha256`` the fingerprint a checkpoint carries,
``field_docs`` what ``mxlarge show --explain`` prints; ``scope`` and ``conditions`` say when a
key takes effect (which of the run's params it is, and docs/config.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

import yaml

from mxlarge.config.schema import DATASETS, LOCAL_NETS, Condition, Config, When


def to_dict(cfg: Any) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""
    def conv(v: Any) -> Any:
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(dataclasses.asdict(cfg))


def fields_of(node: Any = None, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """Every config key by dotted name, with its dataclass field, in the schema's order; the
    sections are walked into, fields marked internal left out."""
    node = Config() if node is None else node
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from fields_of(value, f"{prefix}{f.name}.")
        elif not f.metadata.get("internal"):
            yield f"{prefix}{f.name}", f


def field_docs(node: Any = None, prefix: str = "") -> dict[str, str]:
    """``{'optim.base_lr': '...', ...}``: each field's ``_f`` doc string by dotted key
    (``mxlarge show --explain KEY``; which MLflow params apply, :func:`applies`)."""
    return {key: f.metadata["doc"] for key, f in fields_of(node, prefix) if "doc" in f.metadata}


def conditions() -> dict[str, Condition]:
    """``{'optim.lars_eta': When('optim.lars', 'is', True), ...}``: the keys that take effect
    only when other keys say so (their ``_f(..., when=...)``), by dotted key."""
    return {key: f.metadata["when"] for key, f in fields_of() if "when" in f.metadata}


def scope(key: str) -> Condition | None:
    """The datasets or models ``key`` is limited to, as a condition: a doc string that starts
    with dataset names (``imagenet: ...``, ``digits/cifar10: ...``, ``imagenet validation:
    ...``) limits the field to those datasets, one that starts with model names
    (``small_resnet/resnet1d: ...``, from :data:`LOCAL_NETS`) to those models; None: any."""
    doc = field_docs().get(key, "")
    head = doc.split(":", 1)[0].split(" ", 1)[0] if ":" in doc else ""
    named = tuple(d for d in head.split("/") if d)
    if named and all(d in DATASETS for d in named):
        return When("data.dataset", "in", named)
    if named and all(d in LOCAL_NETS for d in named):
        return When("model.name", "in", named)
    return None


def applies(key: str, cfg: Config) -> bool:
    """Whether ``key`` means anything for ``cfg``'s dataset and model (:func:`scope`)."""
    limit = scope(key)
    return limit is None or limit(cfg)


def flatten(cfg: Config) -> dict[str, Any]:
    """``{'optim.base_lr': 0.1, ...}``: the resolved config as dotted keys (MLflow params)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value
    walk(to_dict(cfg), "")
    return out


def checkpoint_root(cfg: Config) -> str:
    return cfg.train.checkpoint_dir.replace("{name}", cfg.name)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_sha256(cfg: Config) -> str:
    """SHA-256 of the resolved config's YAML: equal iff the configs are equal."""
    return hashlib.sha256(dump_yaml(cfg).encode()).hexdigest()
