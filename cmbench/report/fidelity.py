"""Fidelity to FullKV: how close a method's continuation is to FullKV's continuation of the same task and seed.

A compressed cache changes what the model attends to, so its continuation drifts from the one FullKV
generates from the same noise. Per task (the pairs both entries finished, by task and seed): PSNR and SSIM
of the whole continuation against FullKV's, and of its last frame alone (drift, which grows with the
continuation). PSNR pools the squared error over every pixel and frame (``inf`` when identical); SSIM is
scikit-image's ``structural_similarity`` (the library the MiniWorld score's SSIM uses) with Wang et al.'s
(2004) settings: an 11-pixel Gaussian window of sigma 1.5, population covariances, 8-bit range, per channel,
averaged over the pixels a whole window covers (5 pixels in from each edge), channels and frames (1.0 when
identical; NaN for frames under :data:`SSIM_WINDOW` pixels a side, which hold no whole window). An entry's
value is the mean over its pairs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from skimage.metrics import structural_similarity

from cmbench import bounded_read
from cmbench.data.video import VideoError, VideoReader
from cmbench.errors import ConfigError
from cmbench.identity.paths import inside
from cmbench.report.comparisons import both_finished
from cmbench.report.reading import RunRecords

FIDELITY_COLUMNS = ("psnr_vs_fullkv", "ssim_vs_fullkv", "last_frame_psnr_vs_fullkv", "last_frame_ssim_vs_fullkv")
SSIM_WINDOW = 11  # pixels: the Gaussian window of sigma 1.5 truncated at 3.5 sigma, as scikit-image sizes it


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of ``a`` against ``b``, ``uint8 [..., H, W, 3]`` of one shape; ``inf`` when equal."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of ``a`` against ``b``, ``uint8 [F, H, W, 3]`` (or one frame ``[H, W, 3]``) of one shape."""
    x, y = (np.asarray(v).reshape(-1, *v.shape[-3:]) for v in (a, b))
    if min(x.shape[1:3]) < SSIM_WINDOW:
        return math.nan
    return float(np.mean([structural_similarity(f, g, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                                data_range=255, channel_axis=-1) for f, g in zip(x, y)]))


def video_fidelity(frames: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """The four :data:`FIDELITY_COLUMNS` of one continuation ``uint8 [F, H, W, 3]`` against FullKV's.

    Raises
    ------
    ValueError
        The two videos differ in shape.
    """
    if frames.shape != reference.shape:
        raise ValueError(f"shape {frames.shape} against FullKV's {reference.shape}")
    return {"psnr_vs_fullkv": psnr(frames, reference), "ssim_vs_fullkv": ssim(frames, reference),
            "last_frame_psnr_vs_fullkv": psnr(frames[-1], reference[-1]),
            "last_frame_ssim_vs_fullkv": ssim(frames[-1], reference[-1])}


def _video(folder: str, video: object) -> Path | None:
    """The saved video a record names, or None when it names none, names one outside its run folder (never
    read, as the report's gallery never shows one) or its file is gone."""
    if not isinstance(video, str):
        return None
    try:
        path = inside(folder, *video.split("/"))
    except ConfigError:
        return None
    return path if path.is_file() else None


def _frames(folder: str, video: str) -> np.ndarray:
    """The frames of the continuation ``video`` saved in ``folder``, held as decoded (never allocated from its header's frame count, which
    a received video may set to millions: :func:`cmbench.data.video.read_video` trusts it up to a batch)."""
    reader = VideoReader(inside(folder, *video.split("/")), whole=True)
    frames: list[np.ndarray] = []
    for frame in reader:
        if (len(frames) + 1) * frame.nbytes > bounded_read.DECODE_BUDGET:
            raise VideoError(str(bounded_read.over_limit(reader.path, (len(frames) + 1) * frame.nbytes,
                                                         "decoded video", bounded_read.DECODE_BUDGET)))
        frames.append(frame)
    return np.stack(frames)


def fidelity(run: RunRecords, reference: RunRecords) -> dict[str, float]:
    """:data:`FIDELITY_COLUMNS` of ``run`` against ``reference`` (FullKV), each the mean over the task-and-seed
    pairs both finished with a saved video (a pair whose video files are gone, or named outside their run
    folder, is left out); NaN without one.

    Raises
    ------
    ValueError
        ``<video>: ...`` for a pair whose videos cannot be compared (other shapes).
    """
    mine, ref = both_finished(run, reference)
    rows = []
    for (_, a), (_, b) in zip(mine.iterrows(), ref.iterrows()):
        if _video(a["folder"], a["video"]) is None or _video(b["folder"], b["video"]) is None:
            continue
        try:
            rows.append(video_fidelity(_frames(a["folder"], a["video"]), _frames(b["folder"], b["video"])))
        except ValueError as err:
            raise ValueError(f"{a['folder']}/{a['video']}: {err}") from err
    if not rows:
        return {name: math.nan for name in FIDELITY_COLUMNS}
    table = pd.DataFrame(rows)
    return {name: float(table[name].mean()) for name in FIDELITY_COLUMNS}
