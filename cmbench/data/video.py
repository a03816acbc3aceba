"""Video I/O with OpenCV and the context preparation of the authors' runtime.

Frames are always ``uint8 [F, H, W, 3]`` in RGB order.

Context preparation (paper.md): decode, resample to the target fps by nearest index, resize, and pad
by repeating the last frame so the latent frame count ``(F + 2 * stride - 2) // stride`` is a whole
number of chunks (Wan VAE temporal stride 4).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import cv2
import numpy as np

from cmbench import bounded_read
from cmbench.errors import CMBenchError


class VideoError(CMBenchError):
    """A video file is missing, unreadable or corrupt."""


def regular_video(path: str | Path) -> Path:
    """``path``, checked to be a regular file before a decoder opens it (a FIFO would hang it, a device
    never end).

    Raises
    ------
    VideoError
        Nothing there, or not a regular file.
    """
    path = Path(path)
    try:
        os.close(bounded_read.open_regular(path))
    except FileNotFoundError:
        raise VideoError(f"{path}: video file not found") from None
    except bounded_read.ReadLimitError as err:
        raise VideoError(str(err)) from None
    except OSError as err:
        raise VideoError(f"{path}: cannot open ({err.strerror or err})") from None
    return path


def _decodable(path: Path, cap: "cv2.VideoCapture", whole: bool) -> None:
    """Refuse a video whose declared frame size (``whole``: frame size x frame count) is over the decode
    limits (:func:`cmbench.bounded_read.check_decode`), before a frame is decoded."""
    height, width = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)), int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
    count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    try:
        bounded_read.check_decode(path, height, width, max(count, 0) if whole else None)
    except bounded_read.ReadLimitError as err:
        raise VideoError(str(err)) from None


def probe_video(path: str | Path) -> tuple[int, float, int, int]:
    """Read a video's header without decoding it.

    Returns
    -------
    (frame_count, fps, height, width)
        ``frame_count`` is the container's count (may be approximate for some codecs).
    """
    path = regular_video(path)
    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            raise VideoError(f"{path}: cannot open video (unsupported codec or corrupt file)")
        count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
    finally:
        cap.release()
    if count <= 0 or fps <= 0:
        raise VideoError(f"{path}: video has no frames or no frame rate (corrupt file?)")
    return count, fps, height, width


LOSSLESS_FOURCCS = frozenset({"FFV1", "HFYU", "FFVH", "PNG ", "MPNG", "UTVD"})  # upper-cased FourCCs
MAX_BATCH_BYTES = 256 * 2**20  # a decoded batch holds at most this many bytes of frames (at least one frame)


def video_codec(path: str | Path) -> str:
    """The FourCC of a video's stream as FFmpeg reports it (``FMP4``, ``avc1``, ``ffv1``; empty when unknown)."""
    cap = cv2.VideoCapture(str(path))
    try:
        code = int(cap.get(cv2.CAP_PROP_FOURCC)) if cap.isOpened() else 0
    finally:
        cap.release()
    text = code.to_bytes(4, "little", signed=False).decode("latin-1") if 0 < code < 2**32 else ""
    return text if text.isprintable() else ""


def is_lossless(codec: str) -> bool:
    """Whether a FourCC (:func:`video_codec`) names a lossless codec (FFV1, HuffYUV, PNG, Ut Video)."""
    return codec.upper() in LOSSLESS_FOURCCS


class VideoReader:
    """Decode a video frame by frame, without holding it all in memory.

    Parameters
    ----------
    path : str or Path
        Any container/codec OpenCV's FFmpeg backend reads (mp4, avi, ...): a regular file whose declared
        frames are at most :data:`cmbench.bounded_read.FRAME_PIXELS` pixels.
    whole : bool
        The caller holds every frame: the declared frame count x frame size must also fit
        :data:`cmbench.bounded_read.DECODE_BUDGET`.

    Attributes
    ----------
    fps : float
        The container's frame rate.
    codec : str
        Its stream's FourCC (:func:`video_codec`).

    shape : tuple of int or None
        ``(F, H, W, 3)`` of the video, known once a pass over it has finished (None before).

    Iterating yields ``uint8 [H, W, 3]`` RGB frames; a corrupt or unreadable file raises
    :class:`VideoError` naming it. :meth:`batches` yields them a batch at a time; every pass decodes
    the file afresh.
    """

    def __init__(self, path: str | Path, whole: bool = False):
        self.path = regular_video(path)
        cap = cv2.VideoCapture(str(self.path))
        try:
            if not cap.isOpened():
                raise VideoError(f"{self.path}: cannot open video (unsupported codec or corrupt file)")
            _decodable(self.path, cap, whole)
            self.fps = float(cap.get(cv2.CAP_PROP_FPS))
        finally:
            cap.release()
        self.codec = video_codec(self.path)
        if self.fps <= 0:
            raise VideoError(f"{self.path}: video has no frame rate")
        self.shape: tuple[int, ...] | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        cap = cv2.VideoCapture(str(self.path))
        decoded = 0
        try:
            while True:
                ok, bgr = cap.read()
                if not ok:
                    break
                decoded += 1
                frame_shape = bgr.shape
                yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        finally:
            cap.release()
        if not decoded:
            raise VideoError(f"{self.path}: no frame could be decoded (corrupt or empty video)")
        self.shape = (decoded, *frame_shape)

    def batches(self, size: int, max_bytes: int = MAX_BATCH_BYTES) -> Iterator[np.ndarray]:
        """Decode the video in consecutive batches of at most ``size`` frames and ``max_bytes`` bytes
        (at least one frame; the last batch may be shorter), so 4K frames are held a few at a time.

        Yields
        ------
        ndarray, ``uint8 [B, H, W, 3]`` RGB, ``B <= size``; only the batch being yielded is held.
        """
        if size < 1:
            raise ValueError(f"batch size must be >= 1, got {size}")
        batch: np.ndarray | None = None
        filled = 0
        for frame in self:  # decoded straight into the batch: never a list and a stacked copy at once
            if batch is None:
                size = max(1, min(size, max_bytes // frame.nbytes))
                batch = np.empty((size, *frame.shape), dtype=np.uint8)
            batch[filled] = frame
            filled += 1
            if filled == size:
                yield batch
                batch, filled = None, 0
        if batch is not None:
            yield batch[:filled]


def read_video(path: str | Path) -> tuple[np.ndarray, float]:
    """Decode a whole video.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    frames : ndarray, ``uint8 [F, H, W, 3]``, RGB
    fps : float
        The container's frame rate.
    """
    reader = VideoReader(path, whole=True)
    count, _, _, _ = probe_video(path)
    frames: np.ndarray | None = None
    n = 0
    for frame in reader:  # copied into one array as decoded: never a list and a stacked copy at once
        if frames is None:  # the header's count is a hint only (a corrupt one may claim millions)
            frames = np.empty((max(1, min(count, MAX_BATCH_BYTES // frame.nbytes)), *frame.shape), dtype=np.uint8)
        if (n + 1) * frame.nbytes > bounded_read.DECODE_BUDGET:  # more frames than its header declared
            raise VideoError(str(bounded_read.over_limit(reader.path, (n + 1) * frame.nbytes, "decoded video",
                                                         bounded_read.DECODE_BUDGET)))
        if n == len(frames):  # more frames than allocated: grow geometrically
            frames = np.concatenate([frames, np.empty_like(frames)])
        frames[n] = frame
        n += 1
    assert frames is not None  # VideoReader raises when nothing decodes
    return frames[:n], reader.fps


@dataclass(frozen=True)
class FrameSample:
    """Frames of a video picked evenly (:func:`sample_frames`).

    Attributes
    ----------
    frames : ndarray, ``uint8 [K, H, W, 3]``
        Frames ``0, spacing, 2 * spacing, ...``.
    spacing : int
    count : int
        The frames the video has (every one was decoded).
    fps : float
        The video's frame rate (the sample's is ``fps / spacing``).
    kept : ndarray ``uint8 [H, W, 3]`` or None
        The frame asked for with ``keep`` (None when not asked for, or past the end).
    """

    frames: np.ndarray
    spacing: int
    count: int
    fps: float
    kept: np.ndarray | None


def sample_frames(path: str | Path, most: int, keep: int | None = None,
                  transform: Callable[[np.ndarray], np.ndarray] | None = None) -> FrameSample:
    """At most ``most`` frames of a video, evenly spaced, in one pass holding at most ``2 * most``.

    The spacing doubles whenever the frames held reach ``2 * most`` (every other one is dropped), so
    memory never depends on the video's length or on what its header claims.

    Parameters
    ----------
    path : str or Path
    most : int
        The frames wanted (at least 1).
    keep : int, optional
        A frame index returned on its own, whatever the spacing (the best frame a report shows).
    transform : callable, optional
        Applied to each frame held (``uint8 [H, W, 3]`` to ``uint8 [H', W', 3]``: a shrink to display size
        keeps 4K frames small).
    """
    if most < 1:
        raise ValueError(f"most must be >= 1, got {most}")
    reader = VideoReader(path)
    spacing, held, kept, count = 1, [], None, 0
    for index, frame in enumerate(reader):
        count = index + 1
        if index % spacing and index != keep:
            continue
        frame = transform(frame) if transform is not None else frame
        if index == keep:
            kept = frame
        if index % spacing:
            continue
        held.append(frame)
        if len(held) == 2 * most:
            held, spacing = held[::2], spacing * 2
    step = -(-len(held) // most)  # ceil: from up to 2 * most frames held to at most ``most``
    return FrameSample(np.stack(held[::step]), spacing * step, count, reader.fps, kept)


def write_video(path: str | Path, frames: np.ndarray, fps: float, codec: str = "mp4v") -> Path:
    """Encode frames to a video file (parent folders are created).

    Parameters
    ----------
    path : str or Path
        Output file; ``.mp4`` for the default codec.
    frames : ndarray, ``uint8 [F, H, W, 3]``, RGB
    fps : float
    codec : str
        FourCC understood by OpenCV's writer.

    Returns
    -------
    Path of the written file.
    """
    path = Path(path)
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(f"frames must be non-empty uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = frames.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*codec), float(fps), (width, height))
    if not writer.isOpened():
        raise VideoError(f"{path}: cannot open a video writer for codec {codec!r}")
    try:
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    return path


LOSSLESS_CODEC = "FFV1"  # FFmpeg's lossless intra codec, in a Matroska container


def write_lossless_video(path: str | Path, frames: np.ndarray, fps: float) -> Path:
    """Encode frames losslessly (FFV1 in ``.mkv``) and check that they decode back bit-exact.

    Parameters
    ----------
    path : str or Path
        Output file, ``.mkv``.
    frames : ndarray, ``uint8 [F, H, W, 3]``, RGB
    fps : float

    Raises
    ------
    VideoError
        When this OpenCV build cannot write FFV1, or the file does not decode to ``frames``.
    """
    path = write_video(path, frames, fps, codec=LOSSLESS_CODEC)
    decoded, _ = read_video(path)
    if decoded.shape != frames.shape or not np.array_equal(decoded, frames):
        raise VideoError(f"{path}: the {LOSSLESS_CODEC} video does not decode to the frames written "
                         f"(this OpenCV build's FFmpeg is not lossless for it)")
    return path


def resample_indices(n_frames: int, src_fps: float, dst_fps: float) -> np.ndarray:
    """Nearest-index resampling from ``src_fps`` to ``dst_fps``.

    The output has ``round(n_frames * dst_fps / src_fps)`` frames (at least 1); output frame ``j``
    shows the source frame nearest to time ``j / dst_fps``.

    Returns
    -------
    ndarray, ``int64 [F_out]``
    """
    if n_frames <= 0 or src_fps <= 0 or dst_fps <= 0:
        raise ValueError("resample_indices needs positive frame count and frame rates")
    n_out = max(1, int(round(n_frames * dst_fps / src_fps)))
    idx = np.floor(np.arange(n_out) * src_fps / dst_fps + 0.5).astype(np.int64)
    return np.clip(idx, 0, n_frames - 1)


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize every frame (area interpolation when shrinking, bicubic when enlarging).

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``

    Returns
    -------
    ndarray, ``uint8 [F, height, width, 3]``
    """
    if frames.shape[1:3] == (height, width):
        return frames
    shrink = height * width < frames.shape[1] * frames.shape[2]
    interp = cv2.INTER_AREA if shrink else cv2.INTER_CUBIC
    return np.stack([cv2.resize(f, (width, height), interpolation=interp) for f in frames])


def latent_frame_count(n_pixel_frames: int, temporal_stride: int = 4) -> int:
    """Latent frame count the authors' runtime uses: ``(F + 2 * stride - 2) // stride``.

    It equals Wan's causal VAE count ``1 + (F - 1) // stride`` when ``F = stride * k + 1``.
    """
    return (n_pixel_frames + 2 * temporal_stride - 2) // temporal_stride


def pad_to_chunks(frames: np.ndarray, chunk_latent_frames: int, temporal_stride: int = 4) -> np.ndarray:
    """Repeat the last frame until the latent frame count is a multiple of the chunk size.

    Parameters
    ----------
    frames : ndarray, ``[F, H, W, 3]``
    chunk_latent_frames : int
        Latent frames per chunk (4 for LingBot).
    temporal_stride : int
        The VAE's temporal stride (4 for Wan, 1 for a frame-wise tokenizer).

    Returns
    -------
    ndarray, ``[F', H, W, 3]`` with ``F' >= F`` the smallest count whose latent count is a multiple of
    ``chunk_latent_frames``.
    """
    n = len(frames)
    target = n
    while latent_frame_count(target, temporal_stride) % chunk_latent_frames:
        target += 1
    if target == n:
        return frames
    return np.concatenate([frames, np.repeat(frames[-1:], target - n, axis=0)])


def prepare_context(
    path: str | Path,
    fps: float,
    height: int,
    width: int,
    chunk_latent_frames: int,
    temporal_stride: int = 4,
) -> np.ndarray:
    """Decode, resample by nearest index, resize, and pad to whole chunks (the authors' runtime).

    Returns
    -------
    ndarray, ``uint8 [F, height, width, 3]``
    """
    frames, src_fps = read_video(path)
    return prepare_frames(frames, src_fps, fps, height, width, chunk_latent_frames, temporal_stride)


def prepare_frames(
    frames: np.ndarray,
    src_fps: float,
    fps: float,
    height: int,
    width: int,
    chunk_latent_frames: int,
    temporal_stride: int = 4,
) -> np.ndarray:
    """:func:`prepare_context` on frames already decoded at ``src_fps``.

    Parameters
    ----------
    frames : ndarray, ``uint8 [F, H, W, 3]``

    Returns
    -------
    ndarray, ``uint8 [F', height, width, 3]``
    """
    frames = frames[resample_indices(len(frames), src_fps, fps)]
    frames = resize_frames(frames, height, width)
    return pad_to_chunks(frames, chunk_latent_frames, temporal_stride)


def read_frames_at(path: str | Path, indices: list[int] | tuple[int, ...]) -> dict[int, np.ndarray]:
    """Decode a few frames in one sequential pass, holding only those frames in memory.

    Frames before the last wanted index are decoded (exact, unlike container seeking) but not
    converted or kept, so memory stays at the wanted frames whatever the video's length.

    Parameters
    ----------
    path : str or Path
    indices : sequence of int
        Frame indices (0-based, any order, repeats allowed).

    Returns
    -------
    dict mapping each wanted index to its ``uint8 [H, W, 3]`` RGB frame

    Raises
    ------
    VideoError
        The file is missing or unreadable, or it ends before the last wanted index.
    """
    path = Path(path)
    keep = {int(i) for i in indices}
    wanted = sorted(keep)
    if wanted and wanted[0] < 0:
        raise ValueError(f"frame indices must be >= 0, got {wanted[0]}")
    regular_video(path)
    cap = cv2.VideoCapture(str(path))
    frames: dict[int, np.ndarray] = {}
    try:
        if not cap.isOpened():
            raise VideoError(f"{path}: cannot open video (unsupported codec or corrupt file)")
        _decodable(path, cap, whole=False)
        for index in range(wanted[-1] + 1 if wanted else 0):
            if index in keep:
                ok, bgr = cap.read()
                if ok:
                    frames[index] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            else:
                ok = cap.grab()
            if not ok:
                raise VideoError(f"{path}: the video ends after {index} frames; frame {wanted[-1]} was asked for")
    finally:
        cap.release()
    return frames
