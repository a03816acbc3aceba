"""A method's knobs: the one that sets its pruning ratio (:class:`Knob`), and the type and range checks of
all of them (its dataclass fields), run when a method is built.

Knobs arrive from Python, from yaml and from command-line overrides (Hydra parses ``gamma=abc`` as a
string and ``probe_step=2.5`` as a float), so every scalar knob is checked against its annotation:
``float`` takes any number (not a boolean), ``int`` a whole number, ``bool`` true or false, ``str`` a
string; ``X | None`` also takes ``None``. A class lists lower bounds in ``knob_minimums`` (merged
along its bases). Knobs of other types (mappings, sequences) are left to the method's own checks.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from cmbench.errors import ConfigError


@dataclass(frozen=True)
class Knob:
    """A method knob that sets its pruning ratio.

    Attributes
    ----------
    name : str
        The dataclass field (e.g. ``"gamma"``).
    low, high : float
        The search range.
    increasing : bool
        Whether a larger value prunes more (a threshold: yes; a number of kept tokens: no).
    log : bool
        Bisect on a log scale (``low > 0``); integer knobs too (a count that spans decades).
    integer : bool
        The knob takes whole values.
    """

    name: str
    low: float
    high: float
    increasing: bool = True
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ConfigError(f"knob {self.name}: low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ConfigError(f"knob {self.name}: a log-scale search needs low > 0, got {self.low}")

    def middle(self, a: float, b: float) -> float:
        """The value between ``a < b`` to evaluate next (integer knobs: a whole value strictly inside,
        or ``a`` when none is left; the bounds need not be whole)."""
        mid = math.sqrt(a * b) if self.log else (a + b) / 2
        if self.integer:
            first, last = math.floor(a) + 1, math.ceil(b) - 1  # the whole values strictly inside (a, b)
            # mid < b, so floor(mid) <= last: only the lower end can bind
            return float(max(math.floor(mid), first)) if first <= last else float(a)
        return mid


_WHAT = {float: "a number", int: "a whole number", bool: "true or false", str: "a string"}


def _scalar(annotation: Any) -> tuple[type, bool] | None:
    """``(scalar type, None allowed)`` of an annotation such as ``int`` or ``float | None``; ``None``
    for anything else."""
    if annotation in _WHAT:
        return annotation, False
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and args[0] in _WHAT and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return None


def _fits(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def knob_minimums(cls: type) -> dict[str, float]:
    """Lower bounds of ``cls``'s knobs: every ``knob_minimums`` along its bases, the subclass winning."""
    out: dict[str, float] = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("knob_minimums", {}))
    return out


def check_knobs(method: Any) -> None:
    """Raise a one-line :class:`ConfigError` naming the first knob of ``method`` whose value has the
    wrong type or is below its minimum, e.g. ``method decoprune: gamma must be a number >= 0, got -1``.
    """
    cls = type(method)
    name = getattr(cls, "name", "") or cls.__qualname__
    hints = typing.get_type_hints(cls)
    minimums = knob_minimums(cls)
    for f in dataclasses.fields(method):
        scalar = _scalar(hints.get(f.name)) if f.init else None
        if scalar is None:
            continue
        kind, optional = scalar
        value, minimum = getattr(method, f.name), minimums.get(f.name)
        if value is None and optional:
            continue
        fits = value is not None and _fits(value, kind)
        if not fits or (minimum is not None and value < minimum):
            bound = "" if minimum is None else f" >= {minimum:g}"
            none = " (or null)" if optional else ""
            raise ConfigError(f"method {name}: {f.name} must be {_WHAT[kind]}{bound}{none}, got {value!r}")
