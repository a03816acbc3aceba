"""The light CPU scorer's stages, and its AUC on MiniWorld same-entity vs twin pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from cmbench.config_paths import CONFIG_DIR
from cmbench.scoring import build_scorer
from cmbench.scoring.appearance import AppearanceEmbedder
from cmbench.scoring.grabcut_segmenter import GrabCutSegmenter
from cmbench.miniworld.scorer_pairs import build_pairs, roc_auc
from cmbench.scoring.stages import ReferenceView, Target
from cmbench.scoring.template_detector import TemplateDetector

ROOT = Path(__file__).resolve().parent.parent


def _background(seed: int, h: int = 32, w: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    smooth = rng.uniform(90, 130, size=3) + rng.normal(0, 4, size=(h, w, 3))
    return np.clip(smooth, 0, 255).astype(np.uint8)


def _striped(size: int, a=(220, 30, 30), b=(250, 250, 250)) -> np.ndarray:
    rows = (np.arange(size) // 2) % 2 == 0
    return np.where(rows[:, None, None], np.array(a, np.uint8), np.array(b, np.uint8)).repeat(size, axis=1)


def _disc(size: int) -> np.ndarray:
    yy, xx = np.mgrid[:size, :size]
    c = (size - 1) / 2
    return (yy - c) ** 2 + (xx - c) ** 2 <= (size / 2) ** 2


def _plant(frame, patch, mask, x, y):
    out = frame.copy()
    out[y : y + patch.shape[0], x : x + patch.shape[1]][mask] = patch[mask]
    return out


def _target_from(frame, patch_mask, x, y) -> Target:
    mask = np.zeros(frame.shape[:2], bool)
    mask[y : y + patch_mask.shape[0], x : x + patch_mask.shape[1]] = patch_mask
    box = np.array([x, y, x + patch_mask.shape[1], y + patch_mask.shape[0]], float)
    return Target(queries=("disc",), references=(ReferenceView(frame=frame, box=box, mask=mask),))


def test_template_detector_finds_the_reference_object_exactly():
    disc, patch = _disc(12), _striped(12)
    reference = _plant(_background(0), patch, disc, 4, 6)
    target = _target_from(reference, disc, 4, 6)
    frames = np.stack([_plant(_background(1), patch, disc, 17, 11), _background(2)])
    detections = TemplateDetector(score_threshold=0.5).detect(frames, target)
    np.testing.assert_array_equal(detections.boxes[0], [17, 11, 29, 23])
    assert detections.scores[0] > 0.95 and detections.scores[1] < 0.5
    np.testing.assert_array_equal(detections.found, [True, False])


def test_template_detector_rescales_by_frame_size_and_tolerates_exposure():
    disc = _disc(24)
    big_reference = _plant(_background(0, 64, 64), np.kron(_striped(12), np.ones((2, 2, 1), np.uint8)), disc, 10, 20)
    target = _target_from(big_reference, disc, 10, 20)  # a 64x64 reference, 32x32 frames: template halves
    frame = _plant(_background(3), _striped(12), _disc(12), 9, 5)
    darker = (frame.astype(np.float32) * 0.8).astype(np.uint8)
    detections = TemplateDetector(score_threshold=0.5).detect(np.stack([frame, darker]), target)
    np.testing.assert_array_equal(detections.boxes, [[9, 5, 21, 17]] * 2)
    assert detections.found.all() and abs(detections.scores[0] - detections.scores[1]) < 0.05


def test_grabcut_segments_an_object_inside_its_box_deterministically():
    disc = _disc(12)
    frame = _plant(_background(4), _striped(12, (30, 70, 225), (40, 190, 60)), disc, 10, 8)
    truth = np.zeros((32, 32), bool)
    truth[8:20, 10:22] = disc
    segmenter = GrabCutSegmenter()
    box = np.array([[8.0, 6.0, 24.0, 22.0]])  # 2 px of background around the object
    mask = segmenter.segment([frame], box)[0]
    assert (mask & truth).sum() / (mask | truth).sum() > 0.9
    assert not mask[:6].any() and not mask[:, :8].any()  # never outside the box
    np.testing.assert_array_equal(segmenter.segment([frame], box)[0], mask)
    whole, empty = segmenter.segment([frame, frame], np.array([[0, 0, 32, 32], [5, 5, 5, 9]], float))
    assert whole.all() and not empty.any()


def test_appearance_descriptor_separates_colours_and_ignores_exposure():
    disc = _disc(12)
    embedder = AppearanceEmbedder(smooth_sigma=1.0)
    red_white, blue_green = _striped(12), _striped(12, (30, 70, 225), (40, 190, 60))
    i, j = np.mgrid[:12, :12]
    checks = np.where((((i // 3) + (j // 3)) % 2 == 1)[..., None], np.uint8([30, 70, 225]), np.uint8([40, 190, 60]))
    brighter = np.clip(red_white.astype(np.float32) * 1.08, 0, 255).astype(np.uint8)
    emb = embedder.embed([red_white, brighter, blue_green, checks], [disc] * 4)
    assert emb.shape == (4, embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert emb[0] @ emb[1] > 0.95  # an exposure change keeps the identity
    assert emb[0] @ emb[2] < 0.7  # same stripes in other colours: the texture block alone still agrees
    assert emb[0] @ emb[3] < 0.5  # other colours and another pattern (a MiniWorld twin): far apart
    with pytest.raises(ValueError, match="empty mask"):
        embedder.embed([red_white], [np.zeros((12, 12), bool)])


def test_roc_auc():
    assert roc_auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([1, 1, 0, 0], bool)) == 1.0
    assert roc_auc(np.array([0.5, 0.5]), np.array([1, 0], bool)) == 0.5
    assert roc_auc(np.array([0.1, 0.9, 0.5]), np.array([1, 0, 0], bool)) == 0.0


def test_pairs_show_the_object_or_its_twin():
    pairs = build_pairs(n_scenes=1, seed=3)
    assert len(pairs) == 2 * 2 * 8 and sum(p.same for p in pairs) == len(pairs) // 2  # 8 objects, 2 sources
    for pair in pairs:
        assert pair.frame_mask.sum() >= 20 and pair.reference_mask.sum() >= 20  # 10-14 px objects in full view
        x0, y0, x1, y1 = (np.array(pair.reference_box) * 32).round().astype(int)
        assert pair.reference_mask[y0:y1, x0:x1].sum() == pair.reference_mask.sum()


@pytest.mark.slow
def test_light_scorer_auc_script_meets_the_bar(tmp_path):
    """The acceptance check of the light scorer: AUC >= 0.95 on MiniWorld pairs (default settings)."""
    out = tmp_path / "auc.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/light_scorer_auc.py"), "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    clean = json.loads(out.read_text())["runs"]["clean"]
    assert clean["all"]["pairs"] == 800
    for source in ("synthetic", "real", "all"):
        assert clean[source]["auc"] >= 0.95, (source, clean[source])
    assert clean["all"]["detection_rate_same"] >= 0.95
    assert clean["all"]["mean_score_same"] > clean["all"]["mean_score_twin"] + 0.5


def test_light_config_builds_on_cpu():
    scorer = build_scorer(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"), cache_dir="")
    assert scorer.cache is None and scorer.name == "light"
    assert isinstance(scorer.detector, TemplateDetector) and scorer.detector.smooth_sigma == 0.7


def test_grabcut_starts_from_exactly_the_box_and_every_frame_gets_a_mask(monkeypatch):
    """Everything outside the box is GrabCut's background from the start (its rectangle is the box's pixels);
    an empty box or one covering the whole frame needs no GrabCut, and the frames after it still get theirs."""
    from cmbench.scoring import grabcut_segmenter

    rects, real = [], grabcut_segmenter.cv2.grabCut
    monkeypatch.setattr(grabcut_segmenter.cv2, "grabCut", lambda img, labels, rect, *a: rects.append(rect) or real(img, labels, rect, *a))
    frames = np.zeros((4, 32, 32, 3), np.uint8)
    frames[:, 12:22, 6:20] = (200, 30, 30)
    boxes = np.array([[0, 0, 0, 0], [0, 0, 32, 32], [4.0, 10.0, 22.0, 24.0], [4.0, 10.0, 22.0, 24.0]])
    masks = GrabCutSegmenter().segment(frames, boxes)
    assert len(masks) == 4 and not masks[0].any() and masks[1].all()
    assert rects == [(4, 10, 18, 14)] * 2  # x, y, width, height of the box's pixels
    assert masks[2][12:22, 6:20].all() and not masks[2][:10].any() and not masks[2][24:].any()
