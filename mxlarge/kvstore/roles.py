"""Parameter roles, decided once from Gluon's own facts.

* **pushed**: trainable (``grad_req != 'null'``): its gradient goes through push/pull.
* **local statistic**: ``grad_req == 'null'`` (BatchNorm running mean/var): never pushed or
  pulled, not even at init; each worker keeps its own (Goyal et al. §5.3: "BN statistics
  should not be computed across all workers").
* **decay**: weight decay applies. By default only to tensors with ``ndim > 1`` (conv and dense
  weights): BatchNorm γ/β and biases (``ndim <= 1``) are not decayed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParamRole:
    name: str
    shape: tuple[int, ...]
    pushed: bool
    local_stat: bool
    decay: bool


def param_roles(params: Mapping[str, Any], decay_bn_bias: bool = False) -> list[ParamRole]:
    """Roles of ``params`` (a Gluon ``ParameterDict`` or name → Parameter), in their
    order.

    Args:
        params: the network's parameters; shapes must be known (initialised).
        decay_bn_bias: also decay 1-D tensors (BN γ/β, biases).
    """
    roles = []
    for name, p in params.items():
        trainable = p.grad_req != "null"
        shape = tuple(int(s) for s in p.shape)
        roles.append(ParamRole(
            name=name,
            shape=shape,
            pushed=trainable,
            local_stat=not trainable,
            decay=trainable and (decay_bn_bias or len(shape) > 1),
        ))
    return roles


def role_counts(roles: list[ParamRole]) -> dict[str, int]:
    """Counts of tensors and elements per role, for ``mxlarge show`` and MLflow tags."""
    def size(r: ParamRole) -> int:
        n = 1
        for s in r.shape:
            n *= s
        return n
    return {
        "pushed": sum(r.pushed for r in roles),
        "local_stats": sum(r.local_stat for r in roles),
        "no_decay": sum(r.pushed and not r.decay for r in roles),
        "pushed_elements": sum(size(r) for r in roles if r.pushed),
    }
