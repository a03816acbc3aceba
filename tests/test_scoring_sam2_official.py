"""The optional official-``sam2`` segmenter: the install message when the package is missing, and the
adapter around ``SAM2ImagePredictor`` (exercised against a stand-in module with the package's API)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from cmbench.scoring.boxes import box_mask
from cmbench.scoring.errors import BackendUnavailableError, ScorerConfigError
from cmbench.scoring.registry import build_stage
from cmbench.scoring.runtime import resolve_runtime


class FakePredictor:
    """``SAM2ImagePredictor``'s calls as the adapter uses them: the mask is the box, shrunk by 1 px."""

    def __init__(self, sam_model, mask_threshold=0.0):
        self.sam_model, self.mask_threshold = sam_model, mask_threshold
        self.image = None

    def set_image(self, image):
        self.image = image

    def predict(self, box=None, multimask_output=True):
        assert not multimask_output and box.shape == (4,)
        shrunk = np.asarray(box, float) + [1, 1, -1, -1]
        mask = box_mask(shrunk, *self.image.shape[:2]).astype(np.float32)
        return mask[None], np.ones(1, np.float32), np.zeros((1, 256, 256), np.float32)


@pytest.fixture
def fake_sam2(monkeypatch):
    built = []
    build = types.ModuleType("sam2.build_sam")
    build.build_sam2 = lambda cfg, ckpt, device="cuda": built.append(("local", cfg, ckpt, device)) or "local-model"
    build.build_sam2_hf = lambda model_id, device="cuda": built.append(("hub", model_id, device)) or "hub-model"
    predictor = types.ModuleType("sam2.sam2_image_predictor")
    predictor.SAM2ImagePredictor = FakePredictor
    monkeypatch.setitem(sys.modules, "sam2", types.ModuleType("sam2"))
    monkeypatch.setitem(sys.modules, "sam2.build_sam", build)
    monkeypatch.setitem(sys.modules, "sam2.sam2_image_predictor", predictor)
    return built


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sam2", None)  # import sam2 -> ImportError, installed or not
    with pytest.raises(BackendUnavailableError, match="pip install --no-build-isolation sam2==1.1.0"):
        build_stage("segmenter", {"backend": "sam2_official", "model": "facebook/sam2.1-hiera-large"}, resolve_runtime("cpu"))


def test_adapter_builds_from_hub_id_or_checkpoint_and_segments_each_box(fake_sam2):
    runtime = resolve_runtime("cpu")
    hub = build_stage("segmenter", {"backend": "sam2_official", "model": "facebook/sam2.1-hiera-large"}, runtime)
    local = build_stage(
        "segmenter",
        {"backend": "sam2_official", "checkpoint": "/w/sam2.1_hiera_large.pt", "model_cfg": "configs/sam2.1/sam2.1_hiera_l.yaml",
         "mask_threshold": 0.5},
        runtime,
    )
    assert fake_sam2 == [("hub", "facebook/sam2.1-hiera-large", "cpu"),
                         ("local", "configs/sam2.1/sam2.1_hiera_l.yaml", "/w/sam2.1_hiera_large.pt", "cpu")]
    assert hub.predictor.sam_model == "hub-model" and local.predictor.mask_threshold == 0.5
    frames = [np.zeros((20, 30, 3), np.uint8), np.zeros((12, 12, 3), np.uint8)]
    masks = hub.segment(frames, np.array([[2, 3, 12, 10], [0, 0, 12, 12]], float))
    assert [m.shape for m in masks] == [(20, 30), (12, 12)] and all(m.dtype == bool for m in masks)
    assert masks[0].sum() == 8 * 5 and masks[1].sum() == 10 * 10


def test_adapter_config_errors(fake_sam2):
    runtime = resolve_runtime("cpu")
    with pytest.raises(ScorerConfigError, match="exactly one of"):
        build_stage("segmenter", {"backend": "sam2_official"}, runtime)
    with pytest.raises(ScorerConfigError, match="also needs `model_cfg`"):
        build_stage("segmenter", {"backend": "sam2_official", "checkpoint": "x.pt"}, runtime)
