"""Knob checking (hypothesis): whatever value a user or a config gives a method's scalar knob, building
the method either succeeds with a value of the declared type, at or above the declared minimum, or raises
a one-line ``ConfigError`` naming the method; never another exception."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmbench.errors import ConfigError
from cmbench.methods import build_method, method_class, method_names
from cmbench.methods.knobs import knob_minimums

SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


def scalar_knobs() -> list[tuple[str, str, type, bool]]:
    """(method, knob, scalar type, None allowed) for every scalar knob of every registered method."""
    out = []
    for name in method_names():
        hints = typing.get_type_hints(method_class(name))
        for f in dataclasses.fields(method_class(name)):
            hint = hints[f.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if hint in SCALARS:
                out.append((name, f.name, hint, False))
            elif len(args) == 1 and args[0] in SCALARS and type(None) in typing.get_args(hint):
                out.append((name, f.name, args[0], True))
    return out


KNOBS = scalar_knobs()
values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                             st.integers(), max_size=2))


def fits(value, kind: type, optional: bool) -> bool:
    if value is None:
        return optional
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def test_every_method_has_scalar_knobs_to_check():
    assert len(KNOBS) >= 25 and {k for _, _, k, _ in KNOBS} >= {int, float, bool}


@pytest.mark.parametrize("method, knob, kind, optional", KNOBS, ids=[f"{m}.{k}" for m, k, _, _ in KNOBS])
@settings(max_examples=10, deadline=None)
@given(value=values)
def test_a_knob_takes_a_fitting_value_or_refuses_in_one_line(method, knob, kind, optional, value):
    minimum = knob_minimums(method_class(method)).get(knob)
    try:
        built = build_method({"name": method, knob: value})
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message and message.startswith((f"method {method}", f"{method}:")), message
        if not fits(value, kind, optional) or (minimum is not None and value is not None and value < minimum):
            assert message == (f"method {method}: {knob} must be {_what(kind)}"
                               f"{'' if minimum is None else f' >= {minimum:g}'}{' (or null)' if optional else ''}"
                               f", got {value!r}")
        return
    got = getattr(built, knob)
    assert fits(value, kind, optional), f"{method}.{knob} accepted {value!r} for a {kind.__name__} knob"
    assert got == value and (minimum is None or got is None or got >= minimum)
    assert not (isinstance(got, float) and math.isnan(got))


def _what(kind: type) -> str:
    return {float: "a number", int: "a whole number", bool: "true or false", str: "a string"}[kind]
