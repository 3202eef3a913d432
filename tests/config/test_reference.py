"""docs/config.md, rendered from the schema: every key described, the page never stale."""
from dataclasses import dataclass

from mxlarge.config import Config, DistConfig, OptimConfig, When, _f, fields_of
from mxlarge.config.reference import (
    COMMAND,
    PAGE,
    accepted,
    main,
    render,
    takes_effect,
    undocumented,
)


def test_every_key_has_a_description():
    """A key without one fails here by name: give its ``_f`` in mxlarge/config/schema.py a doc
    string (``mxlarge show --explain KEY`` prints it, docs/config.md shows it)."""
    assert undocumented() == [], f"keys without a description in mxlarge/config/schema.py: " \
                                 f"{undocumented()}"


def test_a_key_without_a_description_is_named():
    @dataclass(frozen=True)
    class Toy:
        said: int = _f(1, "documented")
        blank: int = _f(2, "  ")
        plain: int = 3

    assert undocumented(Toy()) == ["blank", "plain"]


def test_the_page_is_what_the_schema_renders():
    assert PAGE.read_text() == render(), f"docs/config.md is stale: run {COMMAND}"


def test_every_key_is_in_the_page():
    page = PAGE.read_text()
    keys = [key for key, _ in fields_of()]
    assert len(keys) > 70
    assert [k for k in keys if f"| `{k}` |" not in page] == []


def test_check_fails_on_a_stale_page_and_passes_once_written(tmp_path, capsys):
    page = tmp_path / "config.md"
    page.write_text(render().replace("KVStore type", "KV type"))
    assert main(["--check", "--page", str(page)]) == 1
    assert COMMAND in capsys.readouterr().err
    assert main(["--write", "--page", str(page)]) == 0
    assert main(["--check", "--page", str(page)]) == 0


def test_accepted_says_the_type_and_the_rules():
    assert accepted(int, {"ge": 1}) == "an integer >= 1"
    assert accepted(int | None, {"ge": 1}) == "null or an integer >= 1"
    assert accepted(tuple[float, float], {"gt": 0, "le": 1}) == \
        "a list of 2 numbers, each > 0 and <= 1"
    assert accepted(str, {"choices": ("linear", "sqrt", "none")}) == \
        "one of [linear, sqrt, none]"
    assert accepted(bool, {}) == "true or false"


def test_takes_effect_joins_the_dataset_and_the_keys_condition():
    assert takes_effect("optim.base_lr", {}) == "always"
    assert takes_effect("optim.lars_eta", {"when": When("optim.lars", "is", True)}) == \
        "`optim.lars` is true"
    assert takes_effect("data.flip", {}) == "`data.dataset` is one of [imagenet, cifar10]"
    assert takes_effect("data.threads", {"when": When("dist.devices", ">", 1)}) == \
        "`data.dataset` is imagenet and `dist.devices` > 1"


def test_conditions_read_as_they_test():
    """A condition's words and its test come from one object: (a or b) and c, both ways."""
    store = When("dist.kvstore", "in", ("dist_sync",)) | When("dist.devices", ">", 1)
    both = store & When("optim.decay", "is not", "none")
    assert str(both) == ("(`dist.kvstore` is dist_sync or `dist.devices` > 1) and "
                         "`optim.decay` is not none")
    assert both(Config(dist=DistConfig(devices=2)))
    assert not both(Config(dist=DistConfig(devices=2), optim=OptimConfig(decay="none")))
    assert not both(Config())
    assert str(store | When("dist.simulate_workers", ">", 1)).count(" or ") == 2
