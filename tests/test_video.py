"""Video I/O round trips and the authors' context preparation."""

from __future__ import annotations

import numpy as np
import pytest

from cmbench.data.video import (
    VideoError,
    VideoReader,
    latent_frame_count,
    pad_to_chunks,
    prepare_context,
    probe_video,
    read_video,
    resample_indices,
    resize_frames,
    write_video,
)


def smooth_clip(n=24, h=48, w=64):
    """A smooth moving gradient: codec-friendly, so lossy error stays small."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    frames = [
        np.stack([128 + 100 * np.sin((x + 2 * t) / 9), 128 + 100 * np.cos(y / 7), np.full_like(x, 60.0 + 4 * t)], -1)
        for t in range(n)
    ]
    return np.clip(frames, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("codec,suffix,tol", [("mp4v", ".mp4", 6.0), ("FFV1", ".avi", 0.0)])
def test_write_read_round_trip(tmp_path, codec, suffix, tol):
    clip = smooth_clip()
    path = write_video(tmp_path / f"sub/clip{suffix}", clip, fps=16, codec=codec)
    frames, fps = read_video(path)
    assert frames.shape == clip.shape and frames.dtype == np.uint8
    assert fps == pytest.approx(16.0)
    assert np.abs(frames.astype(int) - clip).mean() <= tol
    # frame identity survives: each decoded frame is closest to its own source frame
    err = np.abs(frames[:, None].astype(int) - clip[None].astype(int)).mean(axis=(2, 3, 4))
    assert (err.argmin(axis=1) == np.arange(len(clip))).all()
    assert probe_video(path) == (24, pytest.approx(16.0), 48, 64)


def test_reader_batches_decode_the_video_in_order_a_batch_at_a_time(tmp_path):
    clip = smooth_clip(n=11)
    reader = VideoReader(write_video(tmp_path / "clip.avi", clip, fps=16, codec="FFV1"))
    assert reader.shape is None
    batches = list(reader.batches(4))
    assert [len(b) for b in batches] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(batches), clip)
    assert reader.shape == (11, 48, 64, 3)
    assert len(list(reader.batches(11))) == 1  # every pass decodes afresh
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        next(reader.batches(0))


def test_missing_and_corrupt_videos_name_the_file(tmp_path):
    with pytest.raises(VideoError, match="nope.mp4: video file not found"):
        read_video(tmp_path / "nope.mp4")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(VideoError, match="bad.mp4: cannot open video"):
        read_video(bad)
    with pytest.raises(VideoError, match="bad.mp4"):
        probe_video(bad)


def test_write_rejects_bad_frames(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        write_video(tmp_path / "x.mp4", np.zeros((2, 8, 8, 3), np.float32), 16)


def test_resample_by_nearest_index():
    # 30 fps -> 16 fps: output j shows the source frame nearest to j / 16 s
    idx = resample_indices(60, 30.0, 16.0)
    assert len(idx) == 32
    assert idx[:6].tolist() == [0, 2, 4, 6, 8, 9]  # 0, 1.875, 3.75, 5.625, 7.5 -> 8, 9.375 -> 9
    assert resample_indices(10, 16.0, 16.0).tolist() == list(range(10))
    assert resample_indices(8, 8.0, 16.0).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7]


def test_latent_count_and_chunk_padding():
    # paper.md: latent frames = (pixel frames + 2 * 4 - 2) // 4
    assert [latent_frame_count(n) for n in (1, 4, 5, 9, 81)] == [1, 2, 2, 3, 21]
    frames = (np.arange(7)[:, None, None, None] * np.ones((1, 2, 2, 3))).astype(np.uint8)
    padded = pad_to_chunks(frames, chunk_latent_frames=4)  # 7 px frames -> 3 latents; 4 latents need 10
    assert len(padded) == 10 and latent_frame_count(10) == 4
    assert (padded[7:] == frames[-1]).all() and (padded[:7] == frames).all()
    assert len(pad_to_chunks(frames, chunk_latent_frames=2, temporal_stride=1)) == 8


def test_prepare_context(tmp_path):
    clip = smooth_clip(n=30)
    path = write_video(tmp_path / "c.mp4", clip, fps=30)
    out = prepare_context(path, fps=16, height=24, width=32, chunk_latent_frames=4)
    # 30 frames at 30 fps -> 16 frames at 16 fps -> 5 latents; padded by repeating the last frame to
    # 26 frames = 8 latents (two chunks of 4)
    assert out.shape == (26, 24, 32, 3)
    assert (out[16:] == out[15]).all()
    src = resize_frames(clip[resample_indices(30, 30.0, 16.0)], 24, 32)
    err = np.abs(out[:16, None].astype(int) - src[None].astype(int)).mean(axis=(2, 3, 4))
    assert err.diagonal().max() < 8  # decoded frames match the resampled source (lossy codec) ...
    assert (err.argmin(axis=1) == np.arange(16)).all()  # ... and in the right order
    assert resize_frames(clip[:2], 48, 64) is not None and resize_frames(clip[:2], 96, 128).shape == (2, 96, 128, 3)


def test_decoded_batches_are_bounded_by_bytes_as_well_as_frames(tmp_path):
    from cmbench.data.video import VideoReader

    frames = np.zeros((10, 16, 16, 3), np.uint8)
    write_video(tmp_path / "v.mp4", frames, 16.0)
    sizes = [len(b) for b in VideoReader(tmp_path / "v.mp4").batches(64, max_bytes=3 * frames[0].nbytes)]
    assert sizes == [3, 3, 3, 1]
    assert [len(b) for b in VideoReader(tmp_path / "v.mp4").batches(4, max_bytes=1)] == [1] * 10  # one at least


def test_read_video_allocates_by_what_decodes_not_by_what_the_header_claims(tmp_path, monkeypatch):
    import tracemalloc

    import cmbench.data.video as video

    write_video(tmp_path / "v.mp4", np.zeros((10, 16, 16, 3), np.uint8), 16.0)
    monkeypatch.setattr(video, "probe_video", lambda path: (16_000_000, 16.0, 16, 16))  # a 1.8 KB file can say so
    tracemalloc.start()
    try:
        frames, _ = video.read_video(tmp_path / "v.mp4")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frames.shape == (10, 16, 16, 3) and peak < 300e6


def test_a_frame_over_the_pixel_limit_is_refused_by_its_declared_size_before_decoding(tmp_path, monkeypatch):
    from cmbench import bounded_read
    from cmbench.data.video import read_frames_at

    path = write_video(tmp_path / "wide.mp4", np.zeros((4, 16, 64, 3), np.uint8), 16.0)
    monkeypatch.setattr(bounded_read, "FRAME_PIXELS", 16 * 64 - 1)  # the width alone puts it over
    for read in (lambda: VideoReader(path), lambda: read_frames_at(path, [0]), lambda: read_video(path)):
        with pytest.raises(VideoError, match=rf"^{path}: declares 64x16 frames, over the 1,023-pixel limit"):
            read()


def test_a_video_that_decodes_more_than_its_header_declares_stops_at_the_decode_budget(tmp_path, monkeypatch):
    from cmbench import bounded_read
    from cmbench.data import video

    path = write_video(tmp_path / "v.mp4", np.zeros((10, 16, 16, 3), np.uint8), 16.0)
    monkeypatch.setattr(bounded_read, "DECODE_BUDGET", 5 * 16 * 16 * 3)
    monkeypatch.setattr(video, "_decodable", lambda *args, **kwargs: None)  # a header that under-declares its count
    with pytest.raises(VideoError, match=rf"^{path}: 4\.5 KiB, over the 3\.8 KiB limit of a decoded video"):  # at frame 6
        video.read_video(path)


def test_a_lossless_video_keeps_its_frames_bit_exact_at_its_rate_and_batches_stay_uint8(tmp_path):
    from cmbench.data.video import write_lossless_video

    frames = np.random.default_rng(0).integers(0, 256, size=(6, 16, 24, 3), dtype=np.uint8)
    path = write_lossless_video(tmp_path / "v.mkv", frames, 12.0)
    count, fps, height, width = probe_video(path)
    assert (count, fps, height, width) == (6, 12.0, 16, 24)
    batches = list(VideoReader(path).batches(4))
    assert [b.dtype for b in batches] == [np.uint8, np.uint8]
    assert np.array_equal(np.concatenate(batches), frames)
