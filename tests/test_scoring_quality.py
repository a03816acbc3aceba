"""VBench's quality metrics: the formulas against hand-computed values on synthetic videos (static, a
single cut, a flicker, a fade), streaming invariance, the config (presets, lists, errors), absence with a
reason, the network metrics on tiny random models, and the record fields."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch

from cmbench.runs.records import QUALITY_FIELDS, SCHEMA_VERSION, TaskRecord
from cmbench.scoring.errors import ScorerConfigError
from cmbench.scoring.quality import (
    ConsistencyAccumulator,
    FlickerAccumulator,
    QualityUnavailable,
    motion_smoothness_score,
)
from cmbench.scoring.quality_light import BackgroundConsistencyLight, SubjectConsistencyLight
from cmbench.scoring.quality_models import shorter_side_size, vbench_input
from cmbench.scoring.registry import QUALITY_PRESETS, build_quality, quality_selection
from cmbench.scoring.runtime import resolve_runtime

CPU = resolve_runtime("cpu")


def grey(values, size=(8, 10)) -> np.ndarray:
    """A video of uniform grey frames, ``uint8 [F, H, W, 3]``."""
    return np.stack([np.full((*size, 3), v, dtype=np.uint8) for v in values])


def flicker(frames: np.ndarray, batch: int | None = None) -> float:
    acc = FlickerAccumulator()
    for start in range(0, len(frames), batch or len(frames)):
        acc.add(frames[start : start + (batch or len(frames))])
    return acc.value()


# --- temporal flickering: (255 - mean MAE of consecutive frames) / 255 ---------------------------

def test_flickering_static_video_is_one():
    assert flicker(grey([77] * 6)) == 1.0


def test_flickering_single_cut():
    # 8 frames, one change of 60 grey levels between frames 3 and 4: MAE per pair 0,0,0,60,0,0,0 -> mean 60/7
    assert flicker(grey([40] * 4 + [100] * 4)) == pytest.approx((255 - 60 / 7) / 255, abs=1e-12)


def test_flickering_flicker_and_fade():
    assert flicker(grey([100, 110] * 4)) == pytest.approx(245 / 255, abs=1e-12)   # every pair differs by 10
    assert flicker(grey(range(0, 80, 10))) == pytest.approx(245 / 255, abs=1e-12)  # a fade of 10 per frame
    # a channel that flickers alone: MAE is over all pixels and channels (1 of 3 channels differs by 30)
    video = grey([50] * 4)
    video[1::2, ..., 0] = 80
    assert flicker(video) == pytest.approx((255 - 10) / 255, abs=1e-12)


def test_flickering_is_the_same_streamed_in_batches():
    rng = np.random.default_rng(0)
    video = rng.integers(0, 256, size=(9, 6, 7, 3), dtype=np.uint8)
    pairs = [np.abs(video[i + 1].astype(float) - video[i].astype(float)).mean() for i in range(8)]
    expected = (255 - np.mean(pairs)) / 255
    for batch in (1, 2, 4, 9):
        assert flicker(video, batch) == pytest.approx(expected, abs=1e-12)


def test_flickering_needs_two_frames():
    with pytest.raises(QualityUnavailable, match="at least 2"):
        flicker(grey([5]))


# --- subject / background consistency: mean over frames i>=1 of (max(0,cos prev) + max(0,cos first)) / 2 --

def consistency(vectors, batch=None) -> float:
    vectors = np.asarray(vectors, dtype=float)
    frames = np.zeros((len(vectors), 2, 2, 3), dtype=np.uint8)
    frames[:, 0, 0, 0] = np.arange(len(vectors))  # frame index, read back by the feature function
    acc = ConsistencyAccumulator("x", lambda f: vectors[f[:, 0, 0, 0]])
    for start in range(0, len(frames), batch or len(frames)):
        acc.add(frames[start : start + (batch or len(frames))])
    return acc.value()


def test_consistency_hand_computed():
    # frame 1: cos 1 to both -> 1; frame 2 ([0,1]): 0 to both -> 0; frame 3 ([-1,0]): 0 to prev, -1 -> 0 to first
    assert consistency([[1, 0], [2, 0], [0, 1], [-1, 0]]) == pytest.approx(1 / 3, abs=1e-12)
    # 60 degrees to the previous, and to the first 60 then 120 (clamped): (0.5+0.5)/2, (0.5+0)/2 -> 0.375
    a = [[1, 0], [0.5, math.sqrt(3) / 2], [-0.5, math.sqrt(3) / 2]]
    assert consistency(a) == pytest.approx((0.5 + 0.25) / 2, abs=1e-12)
    for batch in (1, 2):
        assert consistency(a, batch) == pytest.approx(0.375, abs=1e-12)


def test_consistency_static_cut_and_zero_features():
    assert consistency([[0.3, 0.4]] * 5) == pytest.approx(1.0, abs=1e-12)
    # a cut between two orthogonal views at frame 2 of 4: 1, 0, (1 + 0) / 2 -> 0.5
    assert consistency([[1, 0], [1, 0], [0, 1], [0, 1]]) == pytest.approx(0.5, abs=1e-12)
    # featureless frames agree with each other, not with a featured one
    assert consistency([[0, 0], [0, 0]]) == 1.0
    assert consistency([[1, 0], [0, 0]]) == 0.0


def test_light_consistency_static_and_cut():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    b = np.ascontiguousarray(a[::-1, ::-1])
    for metric in (SubjectConsistencyLight(), BackgroundConsistencyLight(side=4)):
        static = np.stack([a] * 4)
        acc = metric.accumulator()
        acc.add(static)
        assert acc.value() == pytest.approx(1.0, abs=1e-9)
        fa, fb = metric.features(np.stack([a, b])).astype(float)
        c = max(0.0, fa @ fb / np.linalg.norm(fa) / np.linalg.norm(fb))
        assert c < 0.99
        cut = np.stack([a] * 4 + [b] * 4)  # frames 1-3: 1; frame 4: c; frames 5-7: (1 + c) / 2
        acc = metric.accumulator()
        acc.add(cut[:3])
        acc.add(cut[3:])
        assert acc.value() == pytest.approx((3 + c + 3 * (1 + c) / 2) / 7, abs=1e-9), metric.name


def test_background_light_is_a_mean_centred_thumbnail():
    frames = grey([10, 200])
    assert not BackgroundConsistencyLight().features(frames).any()  # flat frames: no layout
    half = np.zeros((1, 8, 8, 3), dtype=np.uint8)
    half[:, :, 4:] = 255
    feats = BackgroundConsistencyLight(side=2).features(half)
    assert feats.reshape(2, 2, 3)[:, 0] == pytest.approx(-0.5) and feats.reshape(2, 2, 3)[:, 1] == pytest.approx(0.5)


# --- motion smoothness: odd frames re-interpolated from even ones ---------------------------------

def midpoint(before, after):
    return ((before.astype(np.float32) + after.astype(np.float32)) / 2).round().astype(np.uint8)


def test_motion_smoothness_fade_is_smooth_and_flicker_is_not():
    assert motion_smoothness_score(grey(range(0, 90, 10)), midpoint) == 1.0  # linear fade: midpoints exact
    # flicker 100/110: the evens are 100, predicted 100, the odds are 110 -> MAE 10
    assert motion_smoothness_score(grey([100, 110] * 4 + [100]), midpoint) == pytest.approx(245 / 255)
    # a cut between frames 3 and 4 of 8: evens 0,2,4,6 = 40,40,100,100; odds 1,3,5 = 40,40,100 predicted
    # 40,70,100 -> MAE (0 + 30 + 0) / 3 = 10
    assert motion_smoothness_score(grey([40] * 4 + [100] * 4), midpoint) == pytest.approx(245 / 255)
    with pytest.raises(QualityUnavailable, match="at least 3"):
        motion_smoothness_score(grey([1, 2]), midpoint)


# --- config, presets, absence -----------------------------------------------------------------------

def test_presets_lists_and_errors():
    assert quality_selection({"quality": "miniworld"}) == list(QUALITY_PRESETS["miniworld"])
    assert quality_selection({"quality": ["temporal_flickering"]}) == ["temporal_flickering"]
    assert quality_selection({}) == [] and quality_selection({"quality": "none"}) == []
    assert set(QUALITY_PRESETS["vbench"]) == {"subject_consistency", "background_consistency", "temporal_flickering",
                                              "motion_smoothness", "aesthetic_quality", "imaging_quality"}
    assert set(QUALITY_FIELDS) >= set(QUALITY_PRESETS["vbench"]) | set(QUALITY_PRESETS["miniworld"])
    with pytest.raises(ScorerConfigError, match="Did you mean 'temporal_flickering'"):
        quality_selection({"quality": ["temporal_flikering"]})
    with pytest.raises(ScorerConfigError, match="not a quality preset"):
        quality_selection({"quality": "vbenc"})
    with pytest.raises(ScorerConfigError, match="more than once"):
        quality_selection({"quality": ["temporal_flickering", "temporal_flickering"]})
    with pytest.raises(ScorerConfigError, match="does not take"):
        build_quality({"quality": ["background_consistency_light"],
                       "quality_settings": {"background_consistency_light": {"sid": 3}}}, CPU)


def test_optional_metrics_are_absent_with_the_reason():
    scorer = build_quality({"quality": ["temporal_flickering", "imaging_quality", "motion_smoothness",
                                        "aesthetic_quality"]}, CPU)
    assert scorer is not None and [m.name for m in scorer.metrics] == ["temporal_flickering"]
    assert "musiq_spaq" in scorer.unavailable["imaging_quality"]
    assert "AMT-S" in scorer.unavailable["motion_smoothness"]
    assert "sa_0_4_vit_l_14_linear.pth" in scorer.unavailable["aesthetic_quality"]
    result = scorer.score(iter([grey([1, 2, 3])]))
    assert result.values == {"temporal_flickering": pytest.approx(254 / 255)}
    assert set(result.absent) == {"imaging_quality", "motion_smoothness", "aesthetic_quality"}


def test_imaging_quality_without_pyiqa_names_the_extra(tmp_path):
    """pyiqa is not installed in CMBench's CPU environment (it needs torchvision)."""
    checkpoint = tmp_path / "musiq_spaq_ckpt-358bb6af.pth"
    checkpoint.write_bytes(b"0")
    try:
        import pyiqa  # noqa: F401
        pytest.skip("pyiqa is installed here")
    except ImportError:
        pass
    scorer = build_quality({"quality": ["imaging_quality"],
                            "quality_settings": {"imaging_quality": {"checkpoint": str(checkpoint)}}}, CPU)
    assert scorer is not None and not scorer.metrics
    reason = scorer.unavailable["imaging_quality"]
    assert "pyiqa" in reason and "cmbench[quality]" in reason and "torchvision" in reason


# --- network metrics on tiny random models ------------------------------------------------------------

def test_vbench_preprocessing_geometry_and_values():
    assert shorter_side_size(480, 832, 224) == (224, 388)  # torchvision Resize(224): int(224 * 832 / 480)
    assert shorter_side_size(832, 480, 224) == (388, 224)
    frames = np.full((2, 480, 832, 3), 200, dtype=np.uint8)
    dino = vbench_input(frames, 224, "bilinear", False, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), CPU.device)
    clip = vbench_input(frames, 224, "bicubic", True, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), CPU.device)
    assert tuple(dino.shape) == (2, 3, 224, 388) and tuple(clip.shape) == (2, 3, 224, 224)
    assert torch.allclose(dino[:, 0], torch.tensor((200 / 255 - 0.485) / 0.229), atol=1e-5)
    assert torch.allclose(clip, torch.tensor((200 / 255 - 0.5) / 0.25), atol=1e-4)


def test_network_metrics_on_tiny_models(tmp_path):
    from cmbench.scoring.tiny_models import tiny_quality_settings

    settings = tiny_quality_settings(tmp_path)
    cfg = {"quality": ["subject_consistency", "background_consistency", "aesthetic_quality"],
           "quality_settings": settings}
    scorer = build_quality(cfg, resolve_runtime("cpu", batch_size=3))
    assert scorer is not None and not scorer.unavailable
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
    b = rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
    video = np.stack([a, a, a, b, b])
    result = scorer.score(iter([video[:2], video[2:]]))
    metrics = {m.name: m for m in scorer.metrics}
    for name, feats in (("subject_consistency", metrics["subject_consistency"].features(video)),
                        ("background_consistency", metrics["background_consistency"].embeddings(video))):
        f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
        per_frame = [(max(0, f[i] @ f[i - 1]) + max(0, f[i] @ f[0])) / 2 for i in range(1, 5)]
        assert result.values[name] == pytest.approx(np.mean(per_frame), abs=1e-5), name
    aesthetic = metrics["aesthetic_quality"]
    embeds = torch.from_numpy(aesthetic.embeddings(video))
    head = torch.load(settings["aesthetic_quality"]["head"], weights_only=True)
    by_hand = (torch.nn.functional.normalize(embeds, dim=-1) @ head["weight"].T + head["bias"]).squeeze(-1) / 10
    assert result.values["aesthetic_quality"] == pytest.approx(float(by_hand.mean()), abs=1e-5)
    # the formula calls a static video perfectly consistent for any model; the scorer records it undefined
    for name in ("subject_consistency", "background_consistency"):
        acc = metrics[name].accumulator()
        acc.add(np.stack([a] * 3))
        assert acc.value() == pytest.approx(1.0, abs=1e-5)
    static = scorer.score(iter([np.stack([a] * 3)]))
    assert set(static.values) == {"aesthetic_quality"}
    assert static.absent["subject_consistency"].startswith("undefined: ")
    # the models are identified by content
    assert set(scorer.identity()) == {"subject_consistency", "background_consistency", "aesthetic_quality"}
    assert "head" in scorer.identity()["aesthetic_quality"]


def test_aesthetic_head_of_the_wrong_width_is_a_config_error(tmp_path):
    from cmbench.scoring.tiny_models import save_tiny_aesthetic_head, save_tiny_clip_vision

    settings = {"aesthetic_quality": {"model": str(save_tiny_clip_vision(tmp_path / "clip")),
                                      "head": str(save_tiny_aesthetic_head(tmp_path / "head.pth", width=7))}}
    with pytest.raises(ScorerConfigError, match=r"weight \[1, 24\]"):
        build_quality({"quality": ["aesthetic_quality"], "quality_settings": settings}, CPU)


# --- records -----------------------------------------------------------------------------------------

def test_records_carry_quality_and_older_records_upgrade():
    record = TaskRecord(task_id="t", status="ok", temporal_flickering=0.97, subject_consistency_light=0.5,
                        quality_absent={"imaging_quality": "no pyiqa"}, quality_hash="abc")
    again = TaskRecord.from_json(record.to_json())
    assert again.temporal_flickering == 0.97 and again.quality_absent == {"imaging_quality": "no pyiqa"}
    old = TaskRecord.from_json({"task_id": "t", "status": "ok", "schema_version": 3, "score": 0.5})
    assert old.schema_version == SCHEMA_VERSION == 6
    assert all(getattr(old, name) is None for name in QUALITY_FIELDS) and old.quality_absent is None
    with pytest.raises(ValueError, match=r"temporal_flickering: is 1.5, expected a value in \[0, 1\]"):
        TaskRecord(task_id="t", status="ok", temporal_flickering=1.5)
    with pytest.raises(ValueError, match="aesthetic_quality: is not a finite number"):
        TaskRecord(task_id="t", status="ok", aesthetic_quality=float("nan"))
    with pytest.raises(ValueError, match="quality_absent: names temporal_flickering, which has a value"):
        TaskRecord(task_id="t", status="ok", temporal_flickering=0.9, quality_absent={"temporal_flickering": "x"})


@pytest.mark.parametrize("smooth_sigma", [1.0, 0.0])
def test_light_subject_features_are_the_appearance_descriptor_of_whole_frames(smooth_sigma):
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, size=(6, 32, 32, 3), dtype=np.uint8)
    frames[2] = cv2.GaussianBlur(frames[2], (0, 0), 3)  # smooth content too
    frames[3] = 90  # a flat frame amid textured ones: no layout of its own
    frames[5] = 8
    frames[5, 10:14, 10:14] = 255  # last, a dark frame with a bright spot: values in the top lightness bin
    metric = SubjectConsistencyLight(smooth_sigma=smooth_sigma)
    full = np.ones((32, 32), dtype=bool)
    reference = metric.embedder.embed(list(frames), [full] * len(frames))  # the light scorer's own path
    assert np.abs(metric.features(frames) - reference).max() < 1e-5
    flat = metric.features(grey([90, 90], size=(32, 32)))  # a flat frame: colour only, no layout or texture
    layout = slice(metric.embedder.chroma_bins**2 + metric.embedder.lightness_bins, -metric.embedder.orientation_bins)
    assert not flat[:, layout].any() and not flat[:, -metric.embedder.orientation_bins:].any()
    assert np.allclose(flat[0], flat[1])


def _fake_amt_checkout(root) -> tuple:
    """An AMT-shaped checkout whose network blends its two frames by ``embt`` (times a loaded gain):
    ``utils/build_utils.py``, ``cfgs/AMT-S.yaml`` and a ``state_dict`` checkpoint, built offline."""
    (root / "utils").mkdir(parents=True)
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "build_utils.py").write_text(
        "import torch\n\n\n"
        "class Blend(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.gain = torch.nn.Parameter(torch.zeros(()))\n\n"
        "    def forward(self, a, b, embt, scale_factor, eval):\n"
        "        return {'imgt_pred': self.gain * ((1 - embt) * a + embt * b)}\n\n\n"
        "def build_from_cfg(cfg):\n"
        "    assert cfg.name == 'blend'\n"
        "    return Blend()\n")
    (root / "cfgs").mkdir()
    (root / "cfgs" / "AMT-S.yaml").write_text("network:\n  name: blend\n")
    torch.save({"state_dict": {"gain": torch.tensor(1.0)}}, root / "amt-s.pth")
    return str(root), str(root / "cfgs" / "AMT-S.yaml"), str(root / "amt-s.pth")


def test_motion_smoothness_builds_amt_from_its_checkout_and_predicts_the_frame_half_way(tmp_path, monkeypatch):
    import sys

    from cmbench.scoring.quality_models import MotionSmoothness
    from cmbench.scoring.runtime import resolve_runtime

    monkeypatch.setattr(sys, "path", list(sys.path))  # the checkout goes first on the path: undone after
    monkeypatch.delitem(sys.modules, "utils", raising=False)
    monkeypatch.delitem(sys.modules, "utils.build_utils", raising=False)
    root, config, checkpoint = _fake_amt_checkout(tmp_path / "AMT")
    metric = MotionSmoothness(resolve_runtime("cpu"), root, config, checkpoint)
    before = np.zeros((2, 4, 6, 3), np.uint8)
    before[1, :, :, 0] = 100
    after = np.full((2, 4, 6, 3), 200, np.uint8)
    middle = metric.interpolate(before, after)
    assert middle.shape == (2, 4, 6, 3) and middle.dtype == np.uint8  # [N, H, W, 3], as the frames
    assert (middle[0] == 100).all() and (middle[1, ..., 0] == 150).all() and (middle[1, ..., 1:] == 100).all()
    assert metric.identity().keys() == {"checkpoint", "config"}


def test_imaging_quality_input_shrinks_only_a_longer_side_over_the_limit():
    from cmbench.scoring.quality_models import longer_side_input

    frames = np.random.default_rng(0).integers(0, 256, size=(2, 30, 50, 3), dtype=np.uint8)
    small = longer_side_input(frames, 64, torch.device("cpu"))
    assert small.shape == (2, 3, 30, 50) and small.dtype == torch.float32
    torch.testing.assert_close(small, torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255.0)
    assert longer_side_input(frames, 20, torch.device("cpu")).shape == (2, 3, 12, 20)  # int(0.4 * 30) x 20
    tall = longer_side_input(frames.transpose(0, 2, 1, 3).copy(), 20, torch.device("cpu"))
    assert tall.shape == (2, 3, 20, 12)
