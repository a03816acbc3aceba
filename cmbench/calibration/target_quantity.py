"""What a calibration aims a method's knob at: its pruning ratio, or the device bytes of its KV cache.

Both run through one search (:func:`cmbench.calibration.knob_search.search_knob`), which aims at a
quantity in [0, 1) that grows as the method keeps less: the PR itself, or the share of FullKV's device
bytes saved, ``1 - kv_bytes_ratio`` (:mod:`cmbench.cache.ledger`). A bytes target ``b`` (the method's
bytes are ``b`` of FullKV's) is searched as ``1 - b``; with full-precision storage that is the same
search as PR ``1 - b``, and a storage format that keeps fewer bytes per token reaches it at a lower PR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cmbench.errors import ConfigError


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
        return float(target)

    def searched(self, target: float) -> float:
        """The value the knob search aims at for ``target`` (both grow as the method keeps less)."""
        return 1.0 - target if self.saved else target

    def shown(self, searched: float) -> float:
        """A searched value in the user's terms (:meth:`searched` inverted)."""
        return 1.0 - searched if self.saved else searched

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
