"""The feature cache's key follows the models' content: stale weights, processor configs and the
transformers version are misses; identical content is a hit."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import transformers

from cmbench.data import Reference, Task
from cmbench.scoring import build_scorer, feature_cache
from cmbench.scoring.errors import ModelLoadError
from cmbench.scoring.feature_cache import FeatureCache, FrameFeatures, ReferenceFeatures
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


def _frame_features() -> FrameFeatures:
    """Two generated frames, one reference, embeddings of dimension 3: distinct values in every field."""
    return FrameFeatures(
        reference_embeddings=np.array([[0.6, 0.0, 0.8]], dtype=np.float32),
        reference_mask_fallback=np.array([True]),
        boxes=np.array([[1.5, 2.0, 7.0, 9.25], [np.nan] * 4]),
        scores=np.array([0.75, np.nan]),
        detected=np.array([True, False]),
        embeddings=np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32),
        frame_size=np.array([48, 64], dtype=np.int64),
    )


def _assert_same_entry(loaded, stored):
    assert type(loaded) is type(stored)
    for field in fields(stored):
        got, want = getattr(loaded, field.name), getattr(stored, field.name)
        assert got.dtype == want.dtype, field.name
        np.testing.assert_array_equal(got, want, err_msg=field.name)


def test_entry_files_are_named_by_identity_and_key(tmp_path):
    """Task entries live under ``<root>/<config hash>/<models hash>/<video hash[:2]>/``, named
    ``<video hash>_<target hash>.npz``; reference entries under ``<root>/references/<config hash>/<models
    hash>/<key[:2]>/<key>.npz``. Other tools (and people cleaning a cache) find entries by this layout."""
    cache = FeatureCache(tmp_path, "cfg123", "mod456")
    assert cache.path("abcdef", "0789") == tmp_path / "cfg123" / "mod456" / "ab" / "abcdef_0789.npz"
    assert cache.reference_path("xyz9") == tmp_path / "references" / "cfg123" / "mod456" / "xy" / "xyz9.npz"


def test_entries_round_trip_every_field_in_new_folders(tmp_path):
    """A stored task or reference entry loads back with every field's values and dtype, its folders created
    on the way (several levels deep, and again for a second entry in an existing folder); the store returns
    the entry's path and leaves no temporary file behind."""
    cache = FeatureCache(tmp_path / "deep" / "cache", "cfg", "mod")
    features = _frame_features()
    assert cache.store("abcdef", "t1", features) == cache.path("abcdef", "t1")
    assert cache.store("abcdef", "t2", features) == cache.path("abcdef", "t2")  # same folder, already there
    _assert_same_entry(cache.load("abcdef", "t1"), features)
    assert cache.load("abcdef", "t3") is None and cache.load("ffffff", "t1") is None  # never stored

    reference = ReferenceFeatures(embedding=np.array([0.6, 0.8, 0.0], dtype=np.float32), mask_fallback=np.array(True))
    assert cache.store_reference("ref01", reference) == cache.reference_path("ref01")
    _assert_same_entry(cache.load_reference("ref01"), reference)
    assert cache.load_reference("ref02") is None
    assert not list(tmp_path.rglob("*.tmp"))


def test_store_writes_through_a_temporary_file_beside_the_entry(tmp_path, monkeypatch):
    """The entry is written to a ``.tmp`` file in its own folder and renamed into place, so a concurrent
    reader sees either no entry or a whole one (a rename within one folder is atomic)."""
    renames = []
    real_replace = os.replace

    def spy(src, dst):
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(feature_cache.os, "replace", spy)
    cache = FeatureCache(tmp_path, "cfg", "mod")
    path = cache.store("abcdef", "t1", _frame_features())
    [(src, dst)] = renames
    assert dst == path and src.parent == path.parent and src.name.endswith(".tmp")


def test_a_failed_store_leaves_the_previous_entry_and_no_temporary_file(tmp_path, monkeypatch):
    """A write that fails (a full disk, an interrupt) raises, removes its temporary file and leaves the
    entry that was there before untouched."""
    cache = FeatureCache(tmp_path, "cfg", "mod")
    before = _frame_features()
    path = cache.store("abcdef", "t1", before)

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(feature_cache.np, "savez", full_disk)
    changed = FrameFeatures(**{f.name: getattr(before, f.name) for f in fields(before)} | {"scores": np.zeros(2)})
    with pytest.raises(OSError, match="No space left"):
        cache.store("abcdef", "t1", changed)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    monkeypatch.undo()
    _assert_same_entry(cache.load("abcdef", "t1"), before)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"PK\x03\x04 not really a zip", id="garbage"),
        pytest.param("truncated", id="truncated"),
        pytest.param("missing-field", id="missing-field"),
        pytest.param("pickled-object", id="pickled-object"),
    ],
)
def test_an_unreadable_entry_is_a_miss(tmp_path, content):
    """An entry that is empty, garbage, cut short, lacks a field, or holds a pickled object (which loading
    would execute) reads as a miss, never as an entry or an exception."""
    cache = FeatureCache(tmp_path, "cfg", "mod")
    path = cache.store("abcdef", "t1", _frame_features())
    whole = path.read_bytes()
    arrays = {f.name: getattr(_frame_features(), f.name) for f in fields(FrameFeatures)}
    if content == "truncated":
        path.write_bytes(whole[: len(whole) // 2])
    elif content == "missing-field":
        del arrays["frame_size"]
        np.savez(path, **arrays)
    elif content == "pickled-object":
        arrays["boxes"] = np.array([{"box": 1}], dtype=object)
        np.savez(path, **arrays)
    else:
        path.write_bytes(content)
    assert cache.load("abcdef", "t1") is None


def test_a_folder_where_an_entry_should_be_is_a_miss(tmp_path):
    """Only a file is an entry: a folder at an entry's path reads as a miss."""
    cache = FeatureCache(tmp_path, "cfg", "mod")
    cache.reference_path("ref01").mkdir(parents=True)
    assert cache.load_reference("ref01") is None


def test_a_store_whose_temporary_file_vanished_raises_the_renames_own_error(tmp_path, monkeypatch):
    """When the temporary file is gone by the time it is renamed (a cleaner removed it), the store raises
    the rename's error, naming the entry it was writing, not a second error from cleaning up a file that
    is no longer there."""
    real_replace = os.replace

    def vanish_then_replace(src, dst):
        Path(src).unlink()
        real_replace(src, dst)

    monkeypatch.setattr(feature_cache.os, "replace", vanish_then_replace)
    cache = FeatureCache(tmp_path, "cfg", "mod")
    with pytest.raises(FileNotFoundError) as raised:
        cache.store("abcdef", "t1", _frame_features())
    assert raised.value.filename2 == str(cache.path("abcdef", "t1"))
    assert not list(tmp_path.rglob("*.npz")) and not list(tmp_path.rglob("*.tmp"))
