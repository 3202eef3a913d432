"""The cross-field rules: each refuses a combination with one message, in a fixed order."""
import pytest

from mxlarge.config import Config, ConfigError, DistConfig, TrainConfig, load_config, validate
from mxlarge.config.rules import problems
from tests.config import GOOD, write


def test_lars_with_nesterov_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="optim.nesterov = true: expected false with "
                                          "optim.lars = true"):
        load_config(write(tmp_path, GOOD), ["optim.lars=true", "optim.lars_lr=5",
                                            "optim.nesterov=true"])


def test_lars_needs_its_own_global_lr_and_only_lars_takes_one(tmp_path):
    with pytest.raises(ConfigError, match="optim.lars_lr = None: expected the LARS global LR"):
        load_config(write(tmp_path, GOOD), ["optim.lars=true"])
    with pytest.raises(ConfigError, match="optim.lars_lr = 5.0: expected it unset with "
                                          "optim.lars = false"):
        load_config(write(tmp_path, GOOD), ["optim.lars_lr=5"])


def test_step_decay_inside_the_warmup_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"optim.decay_epochs = \[0.5, 3.0\]: expected every "
                                          r"drop after the warmup \(optim.warmup_epochs = 1.0\)"):
        load_config(write(tmp_path, GOOD), ["optim.decay_epochs=[0.5,3]"])


def test_the_first_broken_rule_is_reported_in_a_fixed_order():
    """float16 AMP on a CPU (precision) and compression without a dist store (compression):
    both are problems, the precision one comes first, and validate names the source."""
    cfg = Config(train=TrainConfig(amp="float16"), dist=DistConfig(compression="2bit"))
    found = list(problems(cfg))
    assert [p.split(" = ")[0] for p in found] == ["train.amp", "dist.compression"]
    with pytest.raises(ConfigError) as info:
        validate(cfg, "exp.yaml")
    assert str(info.value) == f"exp.yaml: {found[0]}"
    assert list(problems(Config())) == []
