"""Which place of the panorama every token of a MiniWorld frame shows (ground truth for diagnostics).

A MiniWorld frame is a ``FRAME x FRAME`` window at horizontal offset ``camera_x`` on a wrap-around
panorama ``width`` pixels wide. A token of a backbone whose token grid is ``rows x cols`` per frame
covers ``FRAME / cols`` pixels horizontally, so token ``(row, col)`` of a frame shows panorama column
``(camera_x / (FRAME / cols) + col) mod (width / (FRAME / cols))`` of that row. Two tokens with the same
place id show the same piece of the static world; in a dynamic world (movers, lighting) they show the
same place, not necessarily the same pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cmbench.miniworld.readers import EXTENSION, MiniWorldDataError, extension
from cmbench.miniworld.scene import CAMERA_STEP, FRAME


def token_places(camera_x: np.ndarray, token_rows: int, token_cols: int, width: int) -> np.ndarray:
    """Place id of every token of every frame.

    Parameters
    ----------
    camera_x : ndarray ``int [F]``
        Window offset of each frame, pixels (multiples of the token width).
    token_rows, token_cols : int
        The backbone's token grid per frame (``FRAME`` must be a multiple of both).
    width : int
        Panorama width, pixels.

    Returns
    -------
    ndarray ``int64 [F, token_rows * token_cols]``, frame-major then row then column (the token order
    of a chunk): ``row * (width / token_width) + panorama column``.

    Raises
    ------
    ValueError
        A token grid that does not tile the frame, or an offset that is not on the token grid.
    """
    if token_rows <= 0 or token_cols <= 0 or FRAME % token_cols or FRAME % token_rows:
        raise ValueError(f"a {token_rows}x{token_cols} token grid does not tile a {FRAME}x{FRAME} MiniWorld frame")
    pixels = FRAME // token_cols
    camera_x = np.asarray(camera_x, dtype=np.int64)
    if width % pixels or (camera_x % pixels).any():
        raise ValueError(f"camera offsets and the panorama width ({width} px) must be multiples of the token width "
                         f"{pixels} px (MiniWorld moves in steps of {CAMERA_STEP} px)")
    columns = width // pixels
    col = (camera_x[:, None] // pixels + np.arange(token_cols)[None, :]) % columns  # [F, cols]
    places = np.arange(token_rows)[None, :, None] * columns + col[:, None, :]  # [F, rows, cols]
    return places.reshape(len(camera_x), token_rows * token_cols)


def context_places(task: Any, token_rows: int, token_cols: int) -> np.ndarray:
    """:func:`token_places` of a MiniWorld task's context frames (from its row's camera plan).

    Returns
    -------
    ndarray ``int64 [F_context, token_rows * token_cols]``

    Raises
    ------
    MiniWorldDataError
        The row has no MiniWorld extension, or one without the context's camera plan.
    """
    ext = extension(task)
    if "context_camera_x" not in ext or "panorama_width" not in ext:
        raise MiniWorldDataError(f"task {task.task_id}: no MiniWorld camera plan "
                                 f"({EXTENSION}.context_camera_x / panorama_width)")
    return token_places(np.asarray(ext["context_camera_x"]), token_rows, token_cols, int(ext["panorama_width"]))
