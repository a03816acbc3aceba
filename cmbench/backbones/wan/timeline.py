"""What a real backbone needs to know about a task's context video before the prefill.

The evaluator prepares the context (resample to the backbone's fps by nearest index, resize, pad to
whole chunks; :func:`cmbench.data.prepare_context`) and hands the backbone only the frames to encode;
``condition(task)`` gets the task alone. The Wan-family conditions depend on the context's length in
latent frames (where the continuation prompt takes over) and, for LingBot, on its first frame (the
I2V image). :func:`read_timeline` computes both with the same functions as the evaluator, decoding
the video once without keeping its frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cmbench.data.video import VideoError, VideoReader, latent_frame_count, pad_to_chunks, resample_indices, resize_frames


@dataclass(frozen=True)
class ContextTimeline:
    """Facts of one prepared context video.

    Attributes
    ----------
    latent_frames : int
        ``q0``: latent frames of the prepared (padded) context.
    pixel_frames : int
        Frames of the prepared context.
    first_frame : ndarray, ``uint8 [H, W, 3]``
        Its first frame at the backbone's frame size.
    """

    latent_frames: int
    pixel_frames: int
    first_frame: np.ndarray


def prepared_length(source_frames: int, source_fps: float, fps: float, chunk_latent_frames: int,
                    temporal_stride: int) -> tuple[int, int]:
    """Pixel frames and latent frames of a context of ``source_frames`` frames once prepared.

    Resampled to ``fps`` by nearest index and padded to whole chunks, as
    :func:`cmbench.data.prepare_context` does.
    """
    n = len(resample_indices(source_frames, source_fps, fps))  # its first index is always source frame 0
    padded = len(pad_to_chunks(np.zeros((n, 1, 1, 1), np.uint8), chunk_latent_frames, temporal_stride))
    return padded, latent_frame_count(padded, temporal_stride)


def read_timeline(path: str | Path, fps: float, height: int, width: int, chunk_latent_frames: int,
                  temporal_stride: int) -> ContextTimeline:
    """Length and first frame of a context video as :func:`cmbench.data.prepare_context` prepares it."""
    reader = VideoReader(path)
    first, count, src_fps = None, 0, reader.fps
    for rgb in reader:
        if first is None:
            first = rgb
        count += 1
    if first is None:
        raise VideoError(f"{path}: the context video has no frames")
    padded, latent = prepared_length(count, src_fps, fps, chunk_latent_frames, temporal_stride)
    frame = resize_frames(first[None], height, width)[0]
    return ContextTimeline(latent, padded, frame)
