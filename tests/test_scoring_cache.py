"""The feature cache's key follows the models' content: stale weights, processor configs and the
transformers version are misses; identical content is a hit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import transformers

from cmbench.data import Reference, Task
from cmbench.scoring import build_scorer
from cmbench.scoring.errors import ModelLoadError
from cmbench.scoring.runtime import model_identity
from cmbench.scoring.tiny_models import save_tiny_dinov2, tiny_deep_scorer_config


def _task() -> Task:
    ref = Reference(timestamp_seconds=0.0, bbox_xyxy_normalized=(0.1, 0.2, 0.6, 0.7))
    return Task("syn_001_reappear_01", "synthetic", "s", "v.mp4", ("p",) * 6, "c", "reappear", "red cube", (), (ref,))


def _frames(seed: int, n: int = 3, h: int = 48, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


@pytest.fixture
def cfg(tmp_path):
    return dict(tiny_deep_scorer_config(tmp_path / "models"), cache_dir=str(tmp_path / "cache"))


def test_replacing_the_weights_in_the_same_folder_is_a_cache_miss(cfg):
    frames, ref = _frames(0), _frames(1, 1)[0]
    first = build_scorer(cfg)
    record = first.score_task(_task(), frames, [ref])
    assert (first.cache_hits, first.cache_misses) == (0, 1)
    assert record.scorer_models_hash == first.models_hash and len(first.models_hash) == 12

    folder = Path(cfg["embedder"]["model"])
    save_tiny_dinov2(folder, seed=1)  # other weights, same folder, same config
    stale = build_scorer(cfg)
    assert stale.config_hash == first.config_hash and stale.models_hash != first.models_hash
    features = stale.features(frames, _task().queries, [ref], [_task().references[0].bbox_xyxy_normalized])
    assert (stale.cache_hits, stale.cache_misses) == (0, 1)  # not the stale entry ...
    old = first.features(frames, _task().queries, [ref], [_task().references[0].bbox_xyxy_normalized])
    assert not np.allclose(features.reference_embeddings, old.reference_embeddings)  # ... which held other numbers

    save_tiny_dinov2(folder, seed=1)  # the same weights written again: same content, a hit
    again = build_scorer(cfg)
    assert again.models_hash == stale.models_hash
    again.score_task(_task(), frames, [ref])
    assert (again.cache_hits, again.cache_misses) == (1, 0)


def test_processor_config_and_transformers_version_are_in_the_key(cfg, monkeypatch):
    base = build_scorer(cfg).models_hash
    config = Path(cfg["embedder"]["model"]) / "preprocessor_config.json"
    settings = json.loads(config.read_text())
    settings["image_mean"] = [0.5, 0.5, 0.5]
    config.write_text(json.dumps(settings))
    edited = build_scorer(cfg)
    assert edited.models_hash != base and edited.embedder.spec.mean == (0.5, 0.5, 0.5)
    # (transformers replaces its lazy module in sys.modules on first use: patch the one imports see)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "0.0.0-other")
    assert build_scorer(cfg).models_hash not in (base, edited.models_hash)


def test_hub_models_are_identified_by_their_commit():
    model = SimpleNamespace(config=SimpleNamespace(_commit_hash="0123abcd"))
    identity = model_identity("google/owlvit-base-patch32", model)
    assert identity == {"commit": "0123abcd", "transformers": transformers.__version__}
    with pytest.raises(ModelLoadError, match="cannot tell which revision"):
        model_identity("google/owlvit-base-patch32", SimpleNamespace(config=SimpleNamespace(_commit_hash=None)))


def test_light_stages_have_no_model_identity(tmp_path):
    from omegaconf import OmegaConf

    from cmbench.config_paths import CONFIG_DIR

    light = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "scorer" / "light.yaml"))
    a, b = build_scorer(light, cache_dir=str(tmp_path)), build_scorer(light, cache_dir=str(tmp_path))
    assert a.models_hash == b.models_hash  # no weights: the key is the config (and SCORER_VERSION)
