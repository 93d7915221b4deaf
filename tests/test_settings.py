"""The settings layer: every field of TrainSettings refuses wrong types and ranges (property-based,
with hypothesis), sources layer in order, and errors name the flag or the file and key."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fewshot.cli.main import main
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import SEED_MAX, build
from fewshot.training.settings import TrainSettings, make_config

FIELDS = {f.name: f for f in dataclasses.fields(TrainSettings)}
HINTS = typing.get_type_hints(TrainSettings)

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def accepts_type(hint, value) -> bool:
    """Whether `value` is of the field's declared type, as JSON would carry it."""
    if typing.get_origin(hint) is list:  # list[str]: a list of such items
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(accepts_type(item, v) for v in value)
    options = typing.get_args(hint) or (hint,)
    for option in options:
        if option is type(None) and value is None:
            return True
        if option is bool and isinstance(value, bool):
            return True
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return math.isfinite(value)
        if option in (str, dict, list) and isinstance(value, option):
            return True
    return False


@settings(max_examples=400, deadline=None)
@given(key=st.sampled_from(sorted(FIELDS)), value=anything)
def test_a_value_of_the_wrong_type_is_refused_naming_its_key(key, value):
    if accepts_type(HINTS[key], value):
        return  # right type: the range test below covers it
    with pytest.raises(FewshotError) as refused:
        build(TrainSettings, [("config file c.json", {key: value})])
    assert str(refused.value).startswith(f'config file c.json: "{key}"')


RANGED = [name for name, f in FIELDS.items() if f.metadata.get("low") is not None]


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(RANGED), data=st.data())
def test_a_number_below_its_range_is_refused_naming_its_flag(key, data):
    low = FIELDS[key].metadata["low"]
    is_int = int in (typing.get_args(HINTS[key]) or (HINTS[key],))
    below = (
        data.draw(st.integers(max_value=math.ceil(low) - 1))
        if is_int
        else data.draw(st.floats(max_value=low, exclude_max=True, allow_nan=False))
    )
    with pytest.raises(FewshotError) as refused:
        build(TrainSettings, [("flags", {key: below})])
    assert str(refused.value).startswith(f"--{key.replace('_', '-')} must be")


@settings(max_examples=100, deadline=None)
@given(
    way=st.integers(1, 50),
    shot=st.integers(1, 10),
    query=st.integers(1, 20),
    lr=st.floats(1e-6, 10.0),
    momentum=st.floats(0.0, 0.99),
    smoothing=st.floats(0.0, 0.99),
    seed=st.integers(0, SEED_MAX),
    batch=st.integers(1, 4),
    steps=st.integers(1, 50),
)
def test_valid_values_build_and_round_trip(
    way, shot, query, lr, momentum, smoothing, seed, batch, steps
):
    values = dict(way=way, shot=shot, query=query, lr=lr, momentum=momentum, seed=seed)
    values.update(label_smoothing=smoothing, episodes_per_batch=batch)
    values.update(episodes_per_epoch=batch * steps)
    config = build(TrainSettings, [("flags", values)])
    assert {k: getattr(config, k) for k in values} == values
    assert TrainSettings(**config.to_dict()) == config


def test_sources_layer_in_order_and_errors_name_their_source(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"_comment": "ignored", "way": 10, "shot": 2, "lr": 0.5}')
    config = make_config(str(path), {"shot": 3})
    assert (config.way, config.shot, config.lr, config.query) == (10, 3, 0.5, 15)
    assert (config.val_way, config.val_shot) == (10, 3)  # default to the training shape
    with pytest.raises(FewshotError, match=r"^--shot must be >= 1, got 0$"):
        make_config(str(path), {"shot": 0})
    path.write_text('{"shot": 0}')
    with pytest.raises(FewshotError, match=rf'^config file {path}: "shot" must be >= 1, got 0$'):
        make_config(str(path), {})


@pytest.mark.parametrize(
    ("backbone", "options", "message"),
    [
        ("resnet12", '{"drop_block_size": -1}', "--backbone-options ResNet12 drop_block_size"),
        ("conv4", '{"channels": -3}', "--backbone-options Conv4 channels must be an integer >= 1"),
        ("resnet12", '{"channels": [64, 64]}', "--backbone-options.channels must be a list of 4"),
    ],
)
def test_backbone_options_are_checked_before_any_data(backbone, options, message, capsys, tmp_path):
    args = ["train", "--backbone", backbone, "--backbone-options", options]
    assert main([*args, "--data-root", "/nonexistent", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_json_list_is_a_fixed_length_tuple() -> None:
    settings = TrainSettings(backbone="resnet12", backbone_options={"channels": [8, 8, 16, 16]})
    assert settings.backbone_options == {"channels": [8, 8, 16, 16]}


def test_the_maml_family_starts_from_its_own_optimizer_under_files_and_flags(tmp_path):
    """--method maml without optimizer flags trains as the MAML paper (Adam 1e-3, no decay, no
    schedule); a config file or flag still overrides any of it; embedding keeps SGD 0.1."""
    keys = ("optimizer", "lr", "weight_decay", "lr_schedule")
    maml = make_config(None, {"method": "maml"})
    assert tuple(getattr(maml, k) for k in keys) == ("adam", 1e-3, 0.0, [])
    path = tmp_path / "c.json"
    path.write_text('{"method": "anil", "optimizer": "sgd", "lr_schedule": [[5, 0.1]]}')
    anil = make_config(str(path), {"lr": 0.01})
    assert tuple(getattr(anil, k) for k in keys) == ("sgd", 0.01, 0.0, [[5, 0.1]])
    embedding = make_config(None, {})
    assert (embedding.optimizer, embedding.lr, embedding.weight_decay) == ("sgd", 0.1, 5e-4)


@pytest.mark.parametrize("method", ["embedding", "maml", "fomaml", "anil", "imaml"])
def test_channels_last_is_honoured_or_refused_before_any_data(method, tmp_path, capsys):
    """BatchNorm inside vmap cannot query channels_last tensors on CUDA, so the variants that
    adapt every layer under vmap default to contiguous tensors and refuse channels_last in one
    line before reading data; the embedding method and ANIL (backbone outside vmap) honour it."""
    assert make_config(None, {"method": method}).channels_last == (method == "embedding")
    args = ["train", "--method", method, "--channels-last", "--data-root", str(tmp_path / "none")]
    code = main([*args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    if method in ("maml", "fomaml", "imaml"):
        assert code == 2 and len(err.splitlines()) == 1
        assert f"--channels-last does not apply to --method {method}" in err
    else:  # accepted: it gets as far as the missing data root
        assert code == 2 and "data root" in err and "--channels-last" not in err


@pytest.mark.parametrize(
    ("given", "head_options"),
    [
        ({"backbone": "resnet12"}, {"normalize_by_dim": True}),
        ({"backbone": "resnet12", "head": "ridge"}, {}),
        ({"backbone": "resnet12", "head_options": {}}, {}),
        ({"backbone": "conv4"}, {}),
        ({"backbone": "resnet12", "method": "anil"}, {}),
    ],
)
def test_resnet12_protonet_divides_distances_by_the_dimension_unless_told(given, head_options):
    """ResNet-12's large features made unnormalised squared distances diverge under SGD 0.1;
    its ProtoNet default is MetaOptNet's normalised one, under config files and flags."""
    assert make_config(None, given).head_options == head_options
