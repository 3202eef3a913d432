"""Experiment configuration: the schema (:mod:`.schema`), the strict loader (:mod:`.loader`),
the cross-field rules (:mod:`.rules`) and the config as data (:mod:`.export`).

Every ``from mxlarge.config import X`` reads from here. Layout and rules: docs/design/config.md.
"""
from mxlarge.config.export import (
    applies,
    checkpoint_root,
    conditions,
    config_sha256,
    dump_yaml,
    field_docs,
    fields_of,
    flatten,
    scope,
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
    BN_UNITS,
    DATASETS,
    DIST_STORE,
    KVSTORES,
    LOCAL_NETS,
    STORE_SUMS,
    Condition,
    Config,
    ConfigError,
    DataConfig,
    DistConfig,
    ModelConfig,
    OptimConfig,
    TrackingConfig,
    TrainConfig,
    When,
    _f,
)

__all__ = [
    "BN_UNITS", "DATASETS", "DIST_STORE", "KVSTORES", "LOCAL_NETS", "STORE_SUMS", "Condition",
    "Config", "ConfigError", "DataConfig", "DistConfig", "ModelConfig", "OptimConfig",
    "TrackingConfig", "TrainConfig", "When", "_f", "applies", "checkpoint_root", "conditions",
    "config_from_dict", "config_sha256", "dump_yaml", "field_docs", "fields_of", "flatten",
    "load_config", "load_dataclass", "parse_overrides", "read_yaml", "scope", "to_dict",
    "validate",
]
