"""Property: an HPO settings class refuses every wrong type or range, naming the field, and
builds from every valid value (hypothesis draws both from the fields' own declarations)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fewshot.hpo.splits import MAX_RESPLITS
from fewshot.hpo.tasks.cleaning import Settings as CleaningSettings
from fewshot.hpo.tasks.regularization import Settings as RegularizationSettings
from fewshot.runtime.settings import SEED_MAX, SettingError

BASES = {
    RegularizationSettings: {"dataset": "heart", "model": "logistic", "method": "oehg", "out": "o"},
    CleaningSettings: {"dataset": "mnist", "model": "mlp", "method": "oehg", "out": "o"},
}
CAPS = {"resplits": MAX_RESPLITS}  # the cross-field limit on U: valid draws stay within it
BIG = 10**6


def _cross_field_ok(values: dict) -> bool:
    """OEHG cleaning moves extra_val examples per extra split: they must fit in n_train."""
    count = values.get("resplits") or 5
    return values.get("extra_val", 400) * (count - 1) <= values.get("n_train", 8000)


def _base_type(hint: typing.Any) -> tuple[type, bool]:
    """(the field's type, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def _numeric_fields(cls: type, read_only: bool = False) -> list[dataclasses.Field]:
    """The numeric fields outside BASES; `read_only`: only those the base's method reads (any
    other value of the others is refused: test_hpo_options)."""
    hints = typing.get_type_hints(cls)
    unused = set().union(*cls(**BASES[cls]).unused().values()) if read_only else set()
    return [
        f
        for f in dataclasses.fields(cls)
        if _base_type(hints[f.name])[0] in (int, float)
        and f.name not in BASES[cls]
        and f.name not in unused
    ]


def _valid(cls: type, f: dataclasses.Field) -> st.SearchStrategy:
    """Values inside the field's declared range (and the caps of the cross-field checks)."""
    kind, optional = _base_type(typing.get_type_hints(cls)[f.name])
    m = f.metadata
    if kind is int:
        low = (
            m["low"] if m["low"] is not None else (m["above"] + 1 if m["above"] is not None else 0)
        )
        high = m["high"] if m["high"] is not None else BIG
        values = st.integers(int(low), min(int(high), CAPS.get(f.name, BIG)))
    else:
        lo = m["low"] if m["low"] is not None else m["above"]
        hi = m["high"] if m["high"] is not None else m["below"]
        values = st.floats(
            min_value=-1e6 if lo is None else lo,
            max_value=1e6 if hi is None else hi,
            exclude_min=m["above"] is not None,
            exclude_max=m["below"] is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    return st.one_of(st.none(), values) if optional else values


def _wrong(cls: type, f: dataclasses.Field) -> st.SearchStrategy:
    """Values of a wrong type, outside the declared range, or not finite."""
    kind, optional = _base_type(typing.get_type_hints(cls)[f.name])
    m = f.metadata
    wrong_types = [st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2)]
    if kind is int:
        wrong_types.append(st.floats(allow_nan=False).filter(lambda v: not v.is_integer()))
    else:
        wrong_types.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    if not optional:
        wrong_types.append(st.none())
    number = st.integers if kind is int else st.floats
    out_of_range = []
    if m["low"] is not None:
        below_low = number(max_value=m["low"]).filter(lambda v, low=m["low"]: v < low)
        out_of_range.append(below_low)
    if m["above"] is not None:
        out_of_range.append(number(max_value=m["above"]).filter(lambda v: not math.isnan(v)))
    if m["high"] is not None:
        out_of_range.append(number(min_value=m["high"]).filter(lambda v, h=m["high"]: v > h))
    if m["below"] is not None:
        out_of_range.append(number(min_value=m["below"]).filter(lambda v: not math.isnan(v)))
    finite = [
        s.filter(lambda v: not isinstance(v, float) or math.isfinite(v)) for s in out_of_range
    ]
    return st.one_of(*wrong_types, *finite)


@st.composite
def one_wrong_field(draw, cls: type) -> tuple[str, typing.Any]:
    f = draw(st.sampled_from(_numeric_fields(cls)))
    return f.name, draw(_wrong(cls, f))


@pytest.mark.parametrize("cls", list(BASES), ids=lambda c: c.__module__.split(".")[-1])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_wrong_value_is_refused_naming_its_field(cls, data):
    name, value = data.draw(one_wrong_field(cls))
    with pytest.raises(SettingError) as refused:
        cls(**BASES[cls], **{name: value})
    assert refused.value.key == name, (name, value, str(refused.value))


@pytest.mark.parametrize("cls", list(BASES), ids=lambda c: c.__module__.split(".")[-1])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_valid_values_build(cls, data):
    fields = _numeric_fields(cls, read_only=True)
    values = {f.name: data.draw(_valid(cls, f), label=f.name) for f in fields}
    assume(cls is not CleaningSettings or _cross_field_ok(values))
    built = cls(**BASES[cls], **values)
    for name, value in values.items():
        assert getattr(built, name) == value
    assert isinstance(built.seed, int) and 0 <= built.seed <= SEED_MAX


def test_the_resplit_cap_is_a_setting_error_naming_resplits():
    with pytest.raises(SettingError, match=f"must be <= {MAX_RESPLITS}") as refused:
        RegularizationSettings(**BASES[RegularizationSettings], resplits=MAX_RESPLITS + 1)
    assert refused.value.key == "resplits" and "memory" in str(refused.value)
