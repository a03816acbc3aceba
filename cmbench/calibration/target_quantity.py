"""What a calibration aims a method's knob at: its pruning ratio, or the device bytes of its KV cache.

Both run through one search (:func:`cmbench.calibration.knob_search.search_knob`), which aims at a
quantity in [0, 1) that grows as the method keeps less: the PR itself, or the share of FullKV's device
bytes saved, ``1 - kv_bytes_ratio`` (:mod:`cmbench.cache.ledger`). A bytes target ``b`` (the method's
bytes are ``b`` of FullKV's) is searched as ``1 - b``; with full-precision storage that is the same
search as PR ``1 - b``, and a storage format that keeps fewer bytes per token reaches it at a lower PR.

A bytes target has a floor no knob goes under: a built-in method always keeps its sink and its recent
window, so in full precision it stores at least their tokens at every continuation chunk
(:func:`bytes_floor`); :func:`check_bytes_floor` refuses a target below it before anything is built,
where the data config says the context's length (MiniWorld's ``clips`` x ``clip_frames``) and the
backbone config its chunk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmbench.backbones.wan.timeline import prepared_length
from cmbench.errors import ConfigError
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import METHODS, build_method


@dataclass(frozen=True)
class TargetQuantity:
    """One quantity a knob can be calibrated to.

    Attributes
    ----------
    name : {"pr", "bytes"}
        Its name in files and labels (``<method>_pr85``, ``<method>@bytes15``).
    key : str
        The method key that asks for it (``target_pr``, ``target_bytes``).
    what : str
        What it is, for messages.
    label : str
        Its short name before a number (``PR 0.85``, ``KV bytes / FullKV's 0.15``).
    saved : bool
        True: the user gives the kept share (bytes over FullKV's) and the search aims at ``1 -`` it.
    example : float
        A value for messages.
    """

    name: str
    key: str
    what: str
    label: str
    saved: bool
    example: float

    def check(self, target: object, where: str) -> float:
        """``target`` checked: a PR in [0, 1), or a bytes ratio in (0, 1].

        Raises
        ------
        ConfigError
            One line naming ``where`` (the key as the user wrote it) and what is expected.
        """
        low_open = self.saved
        ok = (not isinstance(target, bool) and isinstance(target, (int, float)) and math.isfinite(target)
              and ((0 < target <= 1) if low_open else (0 <= target < 1)))
        if not ok:
            span = "(0, 1]" if low_open else "[0, 1)"
            raise ConfigError(f"{where}={target!r}: expected {self.what} in {span}, e.g. {where}={self.example:g}")
        assert isinstance(target, (int, float))  # checked above
        return float(target)

    def searched(self, target: float) -> float:
        """The value the knob search aims at for ``target`` (both grow as the method keeps less)."""
        return 1.0 - target if self.saved else target

    def shown(self, searched: float) -> float:
        """A searched value in the user's terms (:meth:`searched` inverted)."""
        return 1.0 - searched if self.saved else searched

    def text(self, searched: float) -> str:
        """A searched value as the user reads it: ``PR 0.8473`` or ``KV bytes / FullKV's 0.1519``."""
        return f"{self.label} {self.shown(searched):.4f}"

    def measured(self, ledger) -> float:
        """The searched value one continuation realised, from its :class:`cmbench.cache.ledger.PRLedger`."""
        return 1.0 - ledger.kv_bytes_ratio() if self.saved else ledger.pruning_ratio()

    def tag(self, target: float) -> str:
        """``0.85 -> "pr85"``, ``0.15 -> "bytes15"``: the target in a file name and a label."""
        return f"{self.name}{round(100 * target, 4):g}"


PR = TargetQuantity("pr", "target_pr", "a pruning ratio", "PR", saved=False, example=0.85)
BYTES = TargetQuantity("bytes", "target_bytes", "a share of FullKV's device KV bytes", "KV bytes / FullKV's", saved=True,
                       example=0.15)
QUANTITIES = (PR, BYTES)
NAMED = {q.name: q for q in QUANTITIES}
"""Each quantity by its ``name`` (as a calibration log records it)."""


def bytes_floor(window_frames: int, context_frames: int, continuation_frames: int, chunk_frames: int) -> float:
    """The least ``kv_bytes_ratio`` of a method that always keeps ``window_frames`` latent frames of history
    (its sink and recent window) in full precision.

    At the continuation's chunk ``i`` FullKV holds ``F_i = context_frames + i * chunk_frames`` frames of every
    head and the method at least ``min(F_i, window_frames)``; the ratio is summed over the chunks as the
    ledger sums it, ``sum_i min(F_i, W) / sum_i F_i`` (1.0 with no history at all).
    """
    held = [context_frames + i * chunk_frames for i in range(continuation_frames // chunk_frames)]
    total = sum(held)
    return 1.0 if total == 0 else sum(min(f, window_frames) for f in held) / total


def _group(cfg: Any, name: str) -> Mapping[str, Any]:
    value = cfg.get(name) if hasattr(cfg, "get") else None
    return value if isinstance(value, Mapping) else {}


def declared_chunk_frames(backbone: Mapping[str, Any]) -> int | None:
    """Latent frames per chunk from the backbone config alone: its ``chunk_frames``, or that of the
    ``.json`` config beside its weights (``path``); ``None`` when neither says."""
    chunk = backbone.get("chunk_frames")
    if chunk is None and backbone.get("path"):
        beside = Path(str(backbone["path"])).with_suffix(".json")
        try:
            chunk = json.loads(beside.read_text()).get("chunk_frames")
        except (OSError, ValueError):  # no config beside the weights, or not one
            chunk = None
    return int(chunk) if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0 else None


def least_window(method_cfg: Mapping[str, Any]) -> tuple[Method, Knob, int] | None:
    """The built-in method of ``method_cfg`` at the end of its knob's range that keeps least, that knob, and
    the chunks the method always keeps (sink + recent window); ``None`` for a plug-in method (its rule may
    keep less), one with a cap on its history (``max_history_tokens``) or without a knob."""
    name = str(method_cfg.get("name"))
    knob = METHODS.get(name).knob if name in METHODS else None  # a plug-in's name is not registered
    if knob is None or method_cfg.get("_target_") or method_cfg.get("max_history_tokens") is not None:
        return None
    least = knob.high if knob.increasing else knob.low
    keys = {k: v for k, v in method_cfg.items() if k not in (BYTES.key, PR.key)}
    method = build_method({**keys, knob.name: int(least) if knob.integer else least})
    return method, knob, method.sink_chunks + method.recent_chunks


def check_bytes_floor(cfg: Any, target: float, where: str) -> None:
    """Refuse a bytes ``target`` below what the method's sink and recent window alone store (nothing is
    checked where the floor cannot be computed from the configs: a quantized storage format, data without
    ``clips`` and ``clip_frames``, a backbone that does not declare its chunk, a plug-in method).

    Parameters
    ----------
    cfg : mapping
        The root config (``method``, ``data``, ``backbone``, ``generation``, ``storage``).
    target : float
        A checked bytes target.
    where : str
        The key as the user wrote it (``method.target_bytes``).

    Raises
    ------
    ConfigError
        One line naming ``where``, the floor and where it comes from.
    """
    data, backbone, generation = _group(cfg, "data"), _group(cfg, "backbone"), _group(cfg, "generation")
    if _group(cfg, "storage").get("name", "fp") != "fp":
        return
    chunk = declared_chunk_frames(backbone)
    found = least_window(_group(cfg, "method"))
    if chunk is None or found is None:
        return
    context = _group(backbone, "context")
    try:
        source = int(data["clips"]) * int(data["clip_frames"])
        frames = prepared_length(source, float(data["fps"]), float(context["fps"]), chunk,
                                 int(context.get("temporal_stride", 4)))[1]
        continuation = int(generation["continuation_frames"])
    except (KeyError, TypeError, ValueError):
        return
    method, knob, chunks = found
    floor = bytes_floor(chunks * chunk, frames, continuation, chunk)
    if target < floor:
        raise ConfigError(
            f"{where}={target:g}: below {floor:.4f}, what {method.name}'s sink and recent window alone store "
            f"({method.sink_chunks} + {method.recent_chunks} chunks of {chunk} latent frames, kept whatever its "
            f"{knob.name}, against FullKV's {frames} context + {continuation} continuation frames); "
            f"give {where} >= {math.ceil(floor * 1e4) / 1e4:g}")
