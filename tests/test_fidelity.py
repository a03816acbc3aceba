"""Fidelity to FullKV (cmbench.report.fidelity): identical videos are inf / 1.0, a shifted one is lower,
PSNR by hand, and an entry's columns are the mean over the pairs it shares with FullKV."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cmbench.report import fidelity as fid
from cmbench.report.reading import RunRecords


def _video(seed: int = 0, frames: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(frames, 24, 24, 3)).astype(np.float64)
    from scipy.ndimage import gaussian_filter
    return np.clip(gaussian_filter(base, (0, 2, 2, 0)) * 3 - 255, 0, 255).astype(np.uint8)  # some structure


def test_identical_videos_are_inf_and_one():
    video = _video()
    got = fid.video_fidelity(video, video.copy())
    assert got == {"psnr_vs_fullkv": math.inf, "ssim_vs_fullkv": 1.0, "last_frame_psnr_vs_fullkv": math.inf,
                   "last_frame_ssim_vs_fullkv": 1.0}


def test_a_shifted_video_is_lower_and_a_drifting_last_frame_shows():
    video = _video()
    shifted = np.roll(video, 3, axis=2)
    got = fid.video_fidelity(shifted, video)
    assert got["psnr_vs_fullkv"] < 30 and got["ssim_vs_fullkv"] < 0.9
    drift = video.copy()
    drift[-1] = np.roll(video[-1], 3, axis=1)  # only the last frame moved
    got = fid.video_fidelity(drift, video)
    assert got["last_frame_psnr_vs_fullkv"] < got["psnr_vs_fullkv"] < math.inf
    assert got["last_frame_ssim_vs_fullkv"] < got["ssim_vs_fullkv"] < 1.0


def test_psnr_by_hand():
    a = np.zeros((2, 2, 2, 3), dtype=np.uint8)
    b = a.copy()
    b[0, 0, 0, 0] = 24  # one pixel-channel of 24: MSE = 24^2 / 24 = 24
    assert fid.psnr(b, a) == pytest.approx(10 * math.log10(255 ** 2 / 24))


def test_ssim_of_a_constant_offset_follows_the_luminance_term():
    """Flat frames 100 and 110: no structure, only the luminance term (2 m1 m2 + C1) / (m1^2 + m2^2 + C1)."""
    a, b = np.full((1, 16, 16, 3), 100, np.uint8), np.full((1, 16, 16, 3), 110, np.uint8)
    c1 = (0.01 * 255) ** 2
    assert fid.ssim(a, b) == pytest.approx((2 * 100 * 110 + c1) / (100 ** 2 + 110 ** 2 + c1))


def test_videos_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match=r"^shape \(4, 24, 24, 3\) against FullKV's \(2, 24, 24, 3\)$"):
        fid.video_fidelity(_video(), _video(frames=2))


def test_an_entry_is_the_mean_over_the_pairs_it_shares_with_fullkv(tmp_path, monkeypatch):
    videos = {"ref/videos/a.mkv": _video(1), "ref/videos/b.mkv": _video(2),
              "m/videos/a.mkv": _video(1), "m/videos/b.mkv": np.roll(_video(2), 2, axis=2)}
    monkeypatch.setattr(fid, "_frames", lambda folder, video: videos[f"{Path(folder).name}/{video}"])
    for name in videos:  # the files must be there (their frames come from the dict)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")

    def entry(folder: str, tasks: list[str]) -> RunRecords:
        frame = pd.DataFrame({"task_id": tasks, "seed": [7] * len(tasks), "run_seed": [2] * len(tasks),
                              "status": ["ok"] * len(tasks), "context_id": tasks, "folder": str(tmp_path / folder),
                              "video": [f"videos/{t}.mkv" for t in tasks], "score": [0.5] * len(tasks)})
        return RunRecords(path=tmp_path / folder, label=folder, frame=frame)

    got = fid.fidelity(entry("m", ["a", "b", "c"]), entry("ref", ["a", "b"]))  # c: no FullKV pair
    b = fid.video_fidelity(videos["m/videos/b.mkv"], videos["ref/videos/b.mkv"])
    assert got["psnr_vs_fullkv"] == math.inf  # a is identical: the mean of inf and b's PSNR
    assert got["ssim_vs_fullkv"] == pytest.approx((1.0 + b["ssim_vs_fullkv"]) / 2)
    assert got["last_frame_ssim_vs_fullkv"] == pytest.approx((1.0 + b["last_frame_ssim_vs_fullkv"]) / 2)
    alone = fid.fidelity(entry("m", ["c"]), entry("ref", ["a"]))
    assert all(math.isnan(v) for v in alone.values())


def test_a_saved_continuation_over_the_decode_budget_is_refused_naming_it(tmp_path, monkeypatch):
    """Frames are held as decoded up to the decode budget; one more is refused in one line that names the
    video, its decoded size and the limit (the budget lowered to 3 frames of this video here, and the
    header's check passed, as a header that declares fewer frames than the file holds passes it)."""
    from cmbench import bounded_read
    from cmbench.data import video
    from cmbench.data.video import VideoError, write_lossless_video

    write_lossless_video(tmp_path / "videos" / "t.mkv", _video(frames=4), 16.0)
    frame_bytes = 24 * 24 * 3
    monkeypatch.setattr(bounded_read, "DECODE_BUDGET", 3 * frame_bytes)
    monkeypatch.setattr(video, "_decodable", lambda path, cap, whole: None)
    with pytest.raises(VideoError, match=rf"^{tmp_path / 'videos' / 't.mkv'}: 6.8 KiB, over the 5.1 KiB limit of a decoded video"):
        fid._frames(str(tmp_path), "videos/t.mkv")
    monkeypatch.setattr(bounded_read, "DECODE_BUDGET", 4 * frame_bytes)
    assert np.array_equal(fid._frames(str(tmp_path), "videos/t.mkv"), _video(frames=4))


def test_ssim_is_scikit_images_with_wangs_window_frame_by_frame():
    """One SSIM in the package, the library's (the MiniWorld score uses it too): Wang et al.'s Gaussian window
    (sigma 1.5), population covariances, 8-bit range, per channel, averaged over frames."""
    from skimage.metrics import structural_similarity

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
    frames = [structural_similarity(x, y, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                    data_range=255, channel_axis=-1) for x, y in zip(a, b)]
    assert fid.ssim(a, b) == pytest.approx(float(np.mean(frames)), abs=1e-12)
    assert fid.ssim(a[1], b[1]) == pytest.approx(frames[1], abs=1e-12)  # one frame [H, W, 3]


def test_frames_smaller_than_the_window_have_no_ssim_and_leave_psnr_alone():
    a = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    got = fid.video_fidelity(a, a + 1)
    assert math.isnan(got["ssim_vs_fullkv"]) and math.isnan(got["last_frame_ssim_vs_fullkv"])
    assert got["psnr_vs_fullkv"] == pytest.approx(10 * math.log10(255 ** 2))
