"""Experiment configuration: the schema (:mod:`.schema`), the strict loader (:mod:`.loader`),
the cross-field rules (:mod:`.rules`) and the config as data (:mod:`.export`).

Every ``from mxlarge.config import X`` reads from here. Layout and rules: docs/design/config.md.
"""
from mxlarge.config.export import (
    applies,
    checkpoint_root,
    config_sha256,
    dump_yaml,
    field_docs,
    flatten,
    to_dict,
)
from mxlarge.config.loader import (
    config_from_dict,
    load_config,
    load_dataclass,
    parse_overrides,
    read_yaml,
)
from mxlarge.config.rules import validate
from mxlarge.config.schema import (
    DATASETS,
    KVSTORES,
    LOCAL_NETS,
    Config,
    ConfigError,
    DataConfig,
    DistConfig,
    ModelConfig,
    OptimConfig,
    TrackingConfig,
    TrainConfig,
    _f,
)

__all__ = [
    "DATASETS", "KVSTORES", "LOCAL_NETS", "Config", "ConfigError", "DataConfig", "DistConfig",
    "ModelConfig", "OptimConfig", "TrackingConfig", "TrainConfig", "_f", "applies",
    "checkpoint_root", "config_from_dict", "config_sha256", "dump_yaml", "field_docs",
    "flatten", "load_config", "load_dataclass", "parse_overrides", "read_yaml", "to_dict",
    "validate",
]
