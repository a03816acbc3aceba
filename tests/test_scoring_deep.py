"""The paper's scorer (OWL-ViT / OWLv2 -> SAM 2 -> DINOv2) end to end on tiny random models.

The models are built from configs, saved with save_pretrained and loaded back through the same
from_pretrained path real weights use (HF_HUB_OFFLINE=1, see conftest.py).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from cmbench.data import Reference, Task
from cmbench.scoring import build_scorer
from cmbench.scoring.dino import Dinov2Embedder
from cmbench.scoring.errors import ModelLoadError, ScorerConfigError
from cmbench.scoring.owl import Owlv2Detector, OwlVitDetector
from cmbench.scoring.pipeline import frames_of
from cmbench.scoring.runtime import Runtime, resolve_runtime
from cmbench.scoring.sam2_hf import Sam2Segmenter
from cmbench.scoring.stages import Target
from cmbench.scoring.tiny_models import tiny_deep_scorer_config


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    return tiny_deep_scorer_config(tmp_path_factory.mktemp("tiny_models"))


def _task(n_refs: int = 1) -> Task:
    refs = tuple(Reference(timestamp_seconds=float(i), bbox_xyxy_normalized=(0.1, 0.2, 0.6, 0.7)) for i in range(n_refs))
    return Task(
        task_id="syn_001_reappear_01", source="synthetic", scene="s", video="videos/synthetic/syn_001.mp4",
        context_clip_prompts=("p",) * 6, continue_prompt="c", task_type="reappear",
        target_label="red cube", target_aliases=("box",), references=refs,
    )


def _frames(seed: int, n: int = 5, h: int = 48, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def _with(cfg: dict, **changes) -> dict:
    out = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        stage, key = dotted.split("__")
        out[stage][key] = value
    return out


def test_record_shapes_and_protocol(tiny_config):
    scorer = build_scorer(tiny_config)
    frames = _frames(0)
    record = scorer.score_task(_task(), frames, [_frames(1, 1, 40, 72)[0]])
    assert record.n_frames == 5 and len(record.similarities) == len(record.boxes) == len(record.detection_scores) == 5
    detected = [s is not None for s in record.similarities]
    assert record.detection_rate == pytest.approx(np.mean(detected))
    assert all((b is None) == (not d) for b, d in zip(record.boxes, detected))
    for box in filter(None, record.boxes):
        assert 0.0 <= box[0] < box[2] <= 1.0 and 0.0 <= box[1] < box[3] <= 1.0  # clipped, positive size
    # threshold 0 and sigmoid scores: every frame has a candidate score in [0, 1]
    assert all(0.0 <= s <= 1.0 for s in record.detection_scores)
    sims = [s for s in record.similarities if s is not None]
    assert record.score == (max(sims) if sims else 0.0)
    assert all(-1.0 - 1e-6 <= s <= 1.0 + 1e-6 for s in sims)
    assert record.scorer == tiny_config["name"] and len(record.scorer_config_hash) == 12
    assert record.detection_threshold == 0.0
    json.dumps(record.to_json())  # JSON-serialisable as is


def test_no_detection_scores_zero(tiny_config):
    scorer = build_scorer(_with(tiny_config, detector__score_threshold=1.01))  # sigmoid never reaches it
    record = scorer.score_task(_task(), _frames(0), [_frames(1, 1)[0]])
    assert record.score == 0.0 and record.detection_rate == 0.0
    assert record.similarities == [None] * 5 and record.boxes == [None] * 5
    assert all(s is not None for s in record.detection_scores)  # candidates exist, all below threshold


def test_empty_masks_are_no_detection_and_reference_falls_back_to_its_box(tiny_config):
    scorer = build_scorer(_with(tiny_config, segmenter__mask_threshold=1e9))  # every SAM mask comes back empty
    record = scorer.score_task(_task(n_refs=2), _frames(0), [_frames(1, 1)[0], _frames(2, 1)[0]])
    assert record.reference_mask_fallback == [True, True]
    assert record.detection_rate == 0.0 and record.score == 0.0


def test_full_masks_detect_every_valid_box(tiny_config):
    # a mask threshold far below every logit makes every mask full: detection then depends only on boxes
    scorer = build_scorer(_with(tiny_config, segmenter__mask_threshold=-1e9))
    features = scorer.features(_frames(0), ("cube",), [_frames(1, 1)[0]], [(0.1, 0.2, 0.6, 0.7)])
    widths = features.boxes[:, 2] - features.boxes[:, 0]
    heights = features.boxes[:, 3] - features.boxes[:, 1]
    np.testing.assert_array_equal(features.detected, (widths >= 1.0) & (heights >= 1.0))
    assert np.all(features.boxes[:, [0, 2]] >= 0) and np.all(features.boxes[:, [0, 2]] <= 64)
    assert np.all(features.boxes[:, [1, 3]] >= 0) and np.all(features.boxes[:, [1, 3]] <= 48)
    assert not features.reference_mask_fallback.any()
    norms = np.linalg.norm(features.embeddings[features.detected], axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_deterministic_across_scorer_instances(tiny_config):
    frames, ref = _frames(3), _frames(4, 1)[0]
    first = build_scorer(tiny_config).score_task(_task(), frames, [ref])
    second = build_scorer(tiny_config).score_task(_task(), frames, [ref])
    assert first == second


def test_cache_hit_on_second_call_skips_every_model(tiny_config, tmp_path, monkeypatch):
    cfg = dict(tiny_config, cache_dir=str(tmp_path / "cache"))
    frames, ref = _frames(5), _frames(6, 1)[0]
    scorer = build_scorer(cfg)
    first = scorer.score_task(_task(), frames, [ref])
    assert (scorer.cache_hits, scorer.cache_misses) == (0, 1)
    assert len(list((tmp_path / "cache" / scorer.config_hash).rglob("*.npz"))) == 1

    fresh = build_scorer(cfg)  # a new process would see the same files

    def boom(*args, **kwargs):
        raise AssertionError("a cached task must not run a model")

    for stage, method in ((fresh.detector, "detect"), (fresh.segmenter, "segment"), (fresh.embedder, "embed")):
        monkeypatch.setattr(stage, method, boom)
    assert fresh.score_task(_task(), frames, [ref]) == first
    assert (fresh.cache_hits, fresh.cache_misses) == (1, 0)

    # other frames, other queries or another reference are other entries
    other_task = Task(**{**_task().__dict__, "target_label": "blue sphere"})
    with pytest.raises(AssertionError, match="cached task"):
        fresh.score_task(other_task, frames, [ref])


def test_config_hash_tracks_result_knobs_only(tiny_config):
    base = build_scorer(tiny_config).config_hash
    assert build_scorer(dict(tiny_config, batch_size=1, description="x")).config_hash == base
    assert build_scorer(_with(tiny_config, detector__score_threshold=0.2)).config_hash != base
    assert build_scorer(_with(tiny_config, embedder__background=128)).config_hash != base


def test_batching_does_not_change_results(tiny_config):
    frames, ref = _frames(7, n=7), _frames(8, 1)[0]
    one = build_scorer(dict(tiny_config, batch_size=1)).score_task(_task(), frames, [ref])
    many = build_scorer(dict(tiny_config, batch_size=5)).score_task(_task(), frames, [ref])
    assert one.detection_scores == pytest.approx(many.detection_scores, abs=1e-5)
    assert [b is None for b in one.boxes] == [b is None for b in many.boxes]
    for a, b in zip(one.boxes, many.boxes):
        if a is not None:
            assert a == pytest.approx(b, abs=1e-5)  # float rounding differs between batch sizes


def test_owlv2_runs_and_scales_boxes_to_the_padded_square(tmp_path):
    cfg = tiny_deep_scorer_config(tmp_path, detector="owlv2")
    record = build_scorer(cfg).score_task(_task(), _frames(0), [_frames(1, 1)[0]])
    assert record.n_frames == 5
    runtime = resolve_runtime("cpu")
    v1 = OwlVitDetector.__new__(OwlVitDetector)
    v2 = Owlv2Detector.__new__(Owlv2Detector)
    assert v1._box_scale(48, 64).tolist() == [64, 48, 64, 48]  # relative to the frame
    assert v2._box_scale(48, 64).tolist() == [64, 64, 64, 64]  # relative to the bottom/right-padded square
    detector = Owlv2Detector(cfg["detector"]["model"], runtime, query_template="a {}", score_threshold=0.0)
    detections = detector.detect(_frames(2, 3, 30, 90), Target(queries=("cube",), references=()))
    assert detections.boxes.shape == (3, 4) and detections.found.all()


def test_segmenter_handles_mixed_frame_sizes_and_box_prompts(tiny_config):
    segmenter = Sam2Segmenter(tiny_config["segmenter"]["model"], resolve_runtime("cpu", batch_size=2), mask_threshold=-1e9)
    frames = [_frames(0, 1, 30, 40)[0], _frames(1, 1, 64, 20)[0], _frames(2, 1, 17, 17)[0]]
    masks = segmenter.segment(frames, np.array([[0, 0, 10, 10], [2, 3, 18, 60], [0, 0, 17, 17]], dtype=float))
    assert [m.shape for m in masks] == [(30, 40), (64, 20), (17, 17)]
    assert all(m.dtype == bool and m.all() for m in masks)


def test_segmenter_gives_the_same_masks_for_an_array_and_for_its_frames(tiny_config):
    segmenter = Sam2Segmenter(tiny_config["segmenter"]["model"], resolve_runtime("cpu", batch_size=3))
    frames = _frames(3, n=5, h=40, w=72)
    boxes = np.array([[4, 5, 40, 30], [0, 0, 72, 40], [10, 2, 30, 38], [50, 10, 70, 35], [1, 1, 9, 9]], dtype=float)
    torch.testing.assert_close(segmenter.preprocess(frames), segmenter.preprocess(list(frames)), rtol=0, atol=0)
    for a, b in zip(segmenter.segment(frames, boxes), segmenter.segment(list(frames), boxes)):
        np.testing.assert_array_equal(a, b)


def test_detected_frames_are_segmented_from_a_view_when_consecutive():
    frames = _frames(4, n=6)
    run = frames_of(frames, np.array([2, 3, 4]))
    assert isinstance(run, np.ndarray) and np.shares_memory(run, frames) and run.shape == (3, 48, 64, 3)
    gaps = frames_of(frames, np.array([0, 2, 5]))
    assert isinstance(gaps, list) and [np.shares_memory(f, frames) for f in gaps] == [True] * 3
    np.testing.assert_array_equal(np.stack(gaps), frames[[0, 2, 5]])


@pytest.mark.parametrize("crop_mode, image_size", [("pad_square", 56), ("processor", None)])
def test_dino_ignores_pixels_outside_the_mask(tiny_config, crop_mode, image_size):
    embedder = Dinov2Embedder(tiny_config["embedder"]["model"], resolve_runtime("cpu"), crop_mode=crop_mode,
                              image_size=image_size, background=0)
    crop = _frames(0, 1, 20, 30)[0]
    mask = np.zeros((20, 30), dtype=bool)
    mask[4:16, 5:25] = True
    other = crop.copy()
    other[~mask] = 255 - other[~mask]
    emb = embedder.embed([crop, other, _frames(1, 1, 20, 30)[0]], [mask, mask, mask])
    assert emb.shape == (3, 32) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(emb[0], emb[1], atol=1e-6)  # only the masked pixels count
    assert float(emb[0] @ emb[2]) < 0.9999  # different object pixels give a different embedding


def test_protocol_knobs_default_to_the_authors_and_are_hashed(tiny_config):
    base = build_scorer(tiny_config)
    assert base.reference_aggregation == "mean" and base.embedder.crop_mode == "processor"
    assert base.embedder.spec.shortest_edge == 64 and base.embedder.spec.crop == (56, 56)  # the folder's processor
    defaults = dict(tiny_config, embedder={k: v for k, v in tiny_config["embedder"].items() if k != "crop_mode"})
    del defaults["reference_aggregation"]
    implicit = build_scorer(defaults)
    assert implicit.reference_aggregation == "mean" and implicit.embedder.crop_mode == "processor"
    hashes = {base.config_hash, build_scorer(dict(tiny_config, reference_aggregation="max")).config_hash,
              build_scorer(_with(tiny_config, embedder__crop_mode="pad_square")).config_hash}
    assert len(hashes) == 3
    with pytest.raises(ScorerConfigError, match="reference_aggregation must be one of mean, max"):
        build_scorer(dict(tiny_config, reference_aggregation="median"))
    with pytest.raises(ScorerConfigError, match="crop_mode must be one of processor, pad_square"):
        build_scorer(_with(tiny_config, embedder__crop_mode="centre"))
    with pytest.raises(ScorerConfigError, match="image_size applies to crop_mode=pad_square"):
        build_scorer(_with(tiny_config, embedder__image_size=56))


def test_crop_modes_differ_on_a_wide_crop(tiny_config):
    runtime = resolve_runtime("cpu")
    model = tiny_config["embedder"]["model"]
    processor = Dinov2Embedder(model, runtime)
    square = Dinov2Embedder(model, runtime, crop_mode="pad_square", image_size=56)
    crop = _frames(3, 1, 12, 60)[0]
    mask = np.ones((12, 60), dtype=bool)
    edges = crop.copy()
    edges[:, :10] = 255 - edges[:, :10]  # outside the centre crop of the processor mode
    a, b = processor.embed([crop, edges], [mask, mask])
    assert float(a @ b) > 0.9999  # the processor's centre crop never sees the crop's sides ...
    c, d = square.embed([crop, edges], [mask, mask])
    assert float(c @ d) < 0.9999  # ... the padded square keeps the whole crop
    assert square.preprocess([crop], [mask]).shape == processor.preprocess([crop], [mask]).shape == (1, 3, 56, 56)


def test_bf16_autocast_is_close_to_fp32(tiny_config):
    cfg = dict(tiny_config, precision="bf16")
    assert build_scorer(cfg).config_hash == build_scorer(tiny_config).config_hash  # a CPU runs fp32
    bf16 = Runtime(device=torch.device("cpu"), precision="bf16", batch_size=4)  # autocast, as on CUDA
    crops = [_frames(i, 1, 30, 40)[0] for i in range(3)]
    masks = [np.ones((30, 40), dtype=bool)] * 3
    model = tiny_config["embedder"]["model"]
    full = Dinov2Embedder(model, resolve_runtime("cpu")).embed(crops, masks)
    half = Dinov2Embedder(model, bf16).embed(crops, masks)
    cosine = np.sum(full * half, axis=1)
    assert cosine.min() > 0.99 and not np.array_equal(full, half)  # autocast ran in bf16, and stays close
    # (SAM 2 masks of random weights sit at the threshold everywhere: its bf16 check needs real weights,
    # scripts/gpu_check_scorer.py)


def test_half_precision_only_on_cuda():
    for precision in ("fp16", "bf16"):
        assert resolve_runtime("cpu", precision=precision).precision == "fp32"
        assert resolve_runtime("auto", precision=precision).precision == (precision if torch.cuda.is_available() else "fp32")
    with pytest.raises(ScorerConfigError, match="precision must be one of fp32, fp16, bf16"):
        resolve_runtime("cpu", precision="half")


def test_config_errors_are_actionable(tiny_config, tmp_path):
    with pytest.raises(ScorerConfigError, match="Did you mean 'owlvit'"):
        build_scorer(_with(tiny_config, detector__backend="owlvt"))
    with pytest.raises(ScorerConfigError, match="does not take score_treshold.*Did you mean 'score_threshold'"):
        build_scorer(_with(tiny_config, detector__score_treshold=0.3))
    with pytest.raises(ScorerConfigError, match="unknown scorer config key"):
        build_scorer(dict(tiny_config, batchsize=3))
    with pytest.raises(ScorerConfigError, match="lacks the stage"):
        build_scorer({k: v for k, v in tiny_config.items() if k != "embedder"})
    with pytest.raises(ModelLoadError, match="cannot load the embedder model"):
        build_scorer(_with(tiny_config, embedder__model=str(tmp_path / "no-such-model")))


@pytest.mark.slow
def test_bench_script_runs_every_stage_on_every_frame(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(root / "scripts/bench_scorer.py"), "--frames", "3", "--repeats", "1", "--size", "40x56",
         "--devices", "cpu", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=root,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "TINY RANDOM models (plumbing speed only)" in run.stdout
    rows = json.loads(out.read_text())
    assert [r["backend"] for r in rows] == ["light", "owlvit->sam2->dinov2"]
    for row in rows:
        assert row["detection_rate"] == 1.0 and row["fps"] > 0 and row["frames"] == 3
        assert set(row["stage_fps"]) == {"detect", "segment", "embed"}


@pytest.mark.slow
def test_bench_script_preprocessing_and_memory_sections(tmp_path):
    import csv
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bench.csv"
    run = subprocess.run(
        [sys.executable, str(root / "scripts/bench_scorer.py"), "--skip-fps", "--preprocess", "--memory", "--threads", "1",
         "--size", "40x56", "--preprocess-frames", "2", "--rounds", "1", "--context-size", "36x64",
         "--context-seconds", "3", "1", "--context-fps", "8", "--continuation-frames", "4",
         "--video-cache", str(tmp_path / "videos"), "--csv", str(out)],
        capture_output=True, text=True, timeout=600, cwd=root,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = list(csv.DictReader(out.open()))
    preprocess = [r for r in rows if r["section"] == "preprocess"]
    assert [r["item"] for r in preprocess] == ["owl", "sam2", "sam2_scattered", "dinov2", "owlv2", "total"] * 2
    assert {r["setting"].split("; ")[1] for r in preprocess} == {"tiny preprocessing sizes", "released preprocessing sizes"}
    for r in preprocess:
        assert r["unit"] == "ms/frame (CPU time)"
        assert float(r["new"]) > 0 and float(r["ratio"]) == pytest.approx(float(r["old"]) / float(r["new"]), rel=0.01, abs=0.006)
    memory = [r for r in rows if r["section"] == "memory"]
    assert [r["item"] for r in memory] == ["peak_rss_score_one_task", "rss_before_task", "task_adds"] * 2
    peak, before, adds = (float(r["new"]) for r in memory[:3])
    assert before < peak and adds == pytest.approx(peak - before, abs=0.2)
    breakdown = [r for r in rows if r["section"] == "memory_breakdown"]
    assert [r["item"] for r in breakdown] == ["runtime", "models", "continuation", "references", "scoring"] * 2
    parts = {r["item"]: float(r["new"]) for r in breakdown[:5]}
    assert sum(parts.values()) == pytest.approx(peak, abs=0.6)  # the steps account for the whole peak
    assert parts["continuation"] + parts["references"] + parts["scoring"] == pytest.approx(
        adds, abs=0.6)
    assert parts["runtime"] > 100  # torch alone is more than that


def test_preprocessing_time_on_a_cpu_is_cpu_time_not_time_taken_by_other_jobs():
    import time

    import torch

    from cmbench.benchmarks.scorer import _per_frame_ms

    waiting = _per_frame_ms(lambda: time.sleep(0.2), 2, torch.device("cpu"))  # as if another job held the core
    assert waiting < 5.0  # wall time would say 100 ms per frame

    def work():
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass

    assert 20.0 <= _per_frame_ms(work, 2, torch.device("cpu")) < 60.0


def test_a_dino_processor_without_a_centre_crop_is_refused_naming_the_model(tiny_config, tmp_path):
    import shutil
    from pathlib import Path

    model = tmp_path / "dino-no-crop"
    shutil.copytree(Path(tiny_config["embedder"]["model"]), model)
    processor = json.loads((model / "preprocessor_config.json").read_text())
    (model / "preprocessor_config.json").write_text(json.dumps({**processor, "do_center_crop": False}))
    with pytest.raises(ValueError, match=rf"^{model}: the DINOv2 image processor has no centre crop "
                                         r"\(do_center_crop is false\)$"):
        Dinov2Embedder(str(model), resolve_runtime("cpu"))


def test_owl_boxes_convert_from_centre_and_size_to_corners():
    from cmbench.scoring.owl import _cxcywh_to_xyxy

    boxes = torch.tensor([[0.5, 0.4, 0.2, 0.6], [0.1, 0.9, 0.2, 0.2]])
    torch.testing.assert_close(_cxcywh_to_xyxy(boxes), torch.tensor([[0.4, 0.1, 0.6, 0.7], [0.0, 0.8, 0.2, 1.0]]))


def test_owl_detector_defaults_identity_and_a_folder_without_its_processor(tiny_config, tmp_path):
    import shutil
    from pathlib import Path

    from cmbench.scoring.runtime import model_identity

    folder = Path(tiny_config["detector"]["model"])
    detector = OwlVitDetector(str(folder), resolve_runtime("cpu"))
    assert detector.query_template == "a photo of a {}"  # the protocol's query, "a photo of a <label>"
    assert detector.identity() == model_identity(str(folder), detector.model) and detector.identity()["files"]
    bare = tmp_path / "owl-without-processor"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, bare / name)
    with pytest.raises(ModelLoadError, match=rf"^cannot load the detector processor model '{bare}'"):
        OwlVitDetector(str(bare), resolve_runtime("cpu"))


def test_the_runtime_device_follows_cuda_and_a_precision_outside_the_list_is_refused(monkeypatch):
    from cmbench.scoring.runtime import Runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_runtime("auto", "bf16").device == torch.device("cuda")  # no CUDA call: a device name
    assert resolve_runtime("auto", "bf16").precision == "bf16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    auto = resolve_runtime("auto", "bf16")
    assert auto.device == torch.device("cpu") and auto.precision == "fp32"  # a CPU runs fp32
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ScorerConfigError, match=rf"^scorer.device='{device}' but CUDA is not available"):
            resolve_runtime(device)
    with pytest.raises(ScorerConfigError, match=r"^scorer.precision must be one of fp32, fp16, bf16, got 'fp8'$"):
        Runtime(device=torch.device("cpu"), precision="fp8", batch_size=1)
