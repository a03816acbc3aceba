"""Continuity: a continuation starts where its context ends and moves as the task's camera does.

Similarity to the context alone cannot tell a copy from a good model: a Revisit task returns the camera
to a view already seen, so a model with perfect memory produces near-copies of context frames. What a
copy breaks is continuity. A continuation's first frame follows the context's last one, one camera step
later, and each of its frames follows the one before as the task's camera plan moves; a context frame
pasted in as the continuation (the reference frame sixteen times, a replay of the context) does neither.

Where the task says how its camera moves (a MiniWorld row carries the camera offset of every context and
continuation frame on its wrap-around panorama), the *continuity error* of a continuation is the largest,
over its transitions (the context's last frame to its first, then each frame to the next), of the mean
absolute pixel difference, in [0, 1], between a frame and the frame before it moved by the camera's step,
over the columns both see (frames of another size are first resized to the context's). A continuation whose
error exceeds :data:`CONTINUITY_THRESHOLD` is *suspect*: its record says why (``suspect``), boards flag it
and leave its entry out of the ranking unless ``leaderboard.allow_suspect=true`` (docs/scoring.md,
"Continuity"). A task without a camera plan (the official CMBench rows) is not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

CONTINUITY_THRESHOLD = 0.07
"""The largest continuity error a continuation may have: over CMBench's own runs of every built-in method on
MiniWorld and under copies of the context (results/continuity_margin.md, ``scripts/continuity_margin.py``)."""


@dataclass(frozen=True)
class CameraPlan:
    """Where a task's camera looks: the context's last offset and every continuation frame's.

    Attributes
    ----------
    last_context_x : int
        Camera offset (pixels on the panorama) of the context's last frame.
    continuation_x : ndarray, ``int64 [F]``
        Camera offset of every continuation frame.
    width : int
        Panorama width in pixels (offsets wrap around it).
    """

    last_context_x: int
    continuation_x: np.ndarray
    width: int

    def steps(self) -> list[int]:
        """The camera's signed step into each continuation frame (pixels, the shorter way round the
        panorama): from the context's last frame into the first, then from each frame into the next."""
        offsets = [self.last_context_x, *(int(x) for x in self.continuation_x)]
        half = self.width // 2
        return [(b - a + half) % self.width - half for a, b in zip(offsets, offsets[1:])]


def shifted_difference(before: np.ndarray, after: np.ndarray, step: int) -> float | None:
    """Mean absolute difference, in [0, 1], between ``after`` and ``before`` moved by the camera's ``step``,
    over the columns both frames see; None when they see none (a step of a frame's width or more).

    Parameters
    ----------
    before, after : ndarray, ``uint8 [H, W, 3]``
        Consecutive frames, ``after``'s camera ``step`` pixels right of ``before``'s (left when negative).
    step : int
    """
    width = before.shape[1]
    if abs(step) >= width:
        return None
    seen_before = before[:, step:] if step >= 0 else before[:, :width + step]
    seen_after = after[:, :width - step] if step >= 0 else after[:, -step:]
    return float(np.abs(seen_before.astype(np.float32) - seen_after.astype(np.float32)).mean() / 255.0)


def resized(frames: Iterable[np.ndarray], height: int, width: int) -> np.ndarray:
    """``frames`` (``uint8 [H', W', 3]`` each) at ``height x width`` (area interpolation), ``uint8 [F, height, width, 3]``."""
    out = [f if f.shape[:2] == (height, width) else cv2.resize(f, (width, height), interpolation=cv2.INTER_AREA)
           for f in frames]
    return np.stack(out) if out else np.zeros((0, height, width, 3), np.uint8)


def continuity_error(last_context: np.ndarray, frames: np.ndarray, plan: CameraPlan) -> float | None:
    """The largest :func:`shifted_difference` over a continuation's transitions (the context's last frame
    into its first frame, then each frame into the next, as far as the plan and the frames go); None when
    no transition shares a column.

    Parameters
    ----------
    last_context : ndarray, ``uint8 [H, W, 3]``
        The context's last frame.
    frames : ndarray, ``uint8 [F, H, W, 3]``
        The continuation at the context's frame size (:func:`resized`).
    plan : CameraPlan
    """
    chain = [last_context, *frames[:len(plan.continuation_x)]]
    errors = [shifted_difference(a, b, step) for a, b, step in zip(chain, chain[1:], plan.steps())]
    known = [e for e in errors if e is not None]
    return max(known) if known else None


def continuity_fields(plan: CameraPlan | None, context: Callable[[], np.ndarray],
                      frames: Iterable[np.ndarray]) -> dict[str, Any]:
    """The record fields of a continuation's continuity: ``continuity`` (its error, None when the task has no
    camera plan) and ``suspect`` (why it is suspect, else None).

    Parameters
    ----------
    plan : CameraPlan or None
        The task's camera plan (a MiniWorld row's: :func:`cmbench.miniworld.readers.camera_plan`); None: the
        task has none and is not checked.
    context : callable ``() -> ndarray uint8 [F_c, H, W, 3]``
        The context frames (only the last is read; called only for a task with a camera plan).
    frames : iterable of ndarray, ``uint8 [H', W', 3]``
        The continuation's frames (read as far as the plan goes, so a streamed video is cut there).
    """
    if plan is None:
        return {"continuity": None, "suspect": None}
    held = context()
    if len(held) == 0:
        return {"continuity": None, "suspect": None}
    last = np.asarray(held[-1])
    wanted = len(plan.continuation_x)
    taken = []
    for frame in frames:
        taken.append(np.asarray(frame))
        if len(taken) == wanted:
            break
    error = continuity_error(last, resized(taken, *last.shape[:2]), plan)
    return {"continuity": error, "suspect": suspect_reason(error)}


def suspect_reason(error: float | None) -> str | None:
    """Why a continuation with continuity error ``error`` is suspect, or None when it is not."""
    if error is None or error <= CONTINUITY_THRESHOLD:
        return None
    return (f"continuity {error:.3f} > {CONTINUITY_THRESHOLD}: its frames do not continue the context's last frame "
            "as the task's camera moves (a copied or replayed frame?)")
