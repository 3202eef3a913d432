"""The config as data: which keys apply to a dataset and model."""
import pytest

from mxlarge.config import Config, DataConfig, ModelConfig, applies


@pytest.mark.parametrize("key, dataset, model, expected", [
    ("data.flip", "digits", "small_resnet", False), ("data.flip", "cifar10", "small_resnet", True),
    ("data.mean", "mnist1d", "resnet1d", False), ("data.mean", "imagenet", "resnet18_v1", True),
    ("data.scale", "cifar10", "small_resnet", False), ("data.ratio", "imagenet", "resnet50_v1",
                                                      True),
    ("model.width", "digits", "small_plain", True), ("model.width", "imagenet", "resnet18_v1",
                                                     False),
    ("optim.base_lr", "digits", "small_resnet", True)])
def test_applies_to_the_dataset_and_the_model(key, dataset, model, expected):
    """What MLflow logs as params: only keys that mean something for the dataset and model."""
    cfg = Config(data=DataConfig(dataset=dataset), model=ModelConfig(name=model))
    assert applies(key, cfg) is expected
