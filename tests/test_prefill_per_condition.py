"""One prefill per distinct prefill condition: tasks of one context with different prompts each get a
prefill conditioned on their own prompt (the authors replay the context under every request's
``continue_prompt``); tasks whose conditioning is identical share one.

A tiny LingBot-shaped backbone (text, camera and I2V conditioning, loaded as the real one) runs two
tasks of one context video with different ``continue_prompt``s, together and each alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cmbench.api import compose_config, evaluate
from cmbench.data.video import read_video
from official_fixture import official_row, write_context_video, write_manifest
from tiny_lingbot import write_tiny_lingbot

pytestmark = pytest.mark.slow  # whole runs of a tiny model, in process

PROMPTS = {"syn_001_reappear_01": "the camera turns back to the vase",
           "syn_001_revisit_01": "a slow walk along the red wall"}


@pytest.fixture(scope="module")
def lingbot_folder(tmp_path_factory) -> Path:
    """Config folder, model, components and a one-context dataset whose two tasks differ in prompt."""
    root = tmp_path_factory.mktemp("prefill_per_condition")
    # std 0.2: with the default 0.05 the text path moves latents by ~3e-5, below one grey level of a frame
    write_tiny_lingbot(root, memory={"offloads": "off", "context_seconds": None}, std=0.2)
    write_context_video(root / "data" / "videos" / "synthetic" / "syn_001.mp4", seed=0)
    rows = [official_row(task_id, "videos/synthetic/syn_001.mp4", task_type=task_id.split("_")[2],
                         continue_prompt=prompt) for task_id, prompt in PROMPTS.items()]
    write_manifest(root / "data", rows)
    return root


def run(root: Path, out: str, task_ids: list[str], monkeypatch) -> tuple[dict, dict]:
    """Records and lossless continuation frames of ``task_ids`` run together in one fresh run."""
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(root / "configs"))
    result = evaluate("decoprune", data="cmbench", backbone="lingbot_tiny", task_ids=task_ids,
                      out_dir=root / out, overrides=[f"data.root={root / 'data'}", "data.check_counts=false",
                                                     "generation.continuation_frames=4"])
    records = {r["task_id"]: r for r in result.records.to_dict("records")}
    frames = {t: read_video(result.run_dir / "videos" / f"{t}.mkv")[0] for t in task_ids}
    return records, frames


def test_each_task_of_a_context_is_prefilled_under_its_own_prompt(lingbot_folder, monkeypatch):
    together, together_frames = run(lingbot_folder, "together", list(PROMPTS), monkeypatch)
    for task_id in PROMPTS:
        alone, alone_frames = run(lingbot_folder, f"alone_{task_id}", [task_id], monkeypatch)
        assert np.array_equal(together_frames[task_id], alone_frames[task_id]), task_id
        for field in ("score", "pr", "context_pr", "kept_tokens", "kept_context_tokens"):
            assert together[task_id][field] == alone[task_id][field], (task_id, field)
        assert list(together[task_id]["similarities"]) == list(alone[task_id]["similarities"])
    # the prompts matter: the two continuations of the one context differ
    first, second = (together_frames[t] for t in PROMPTS)
    assert not np.array_equal(first, second)


@pytest.fixture(scope="module")
def miniworld(tmp_path_factory):
    """A ModelEvaluator of DeCoPrune on a small MiniWorld suite (random tiny model), and the tasks of its
    first context."""
    from cmbench.api import compose_config
    from cmbench.data import load_manifest
    from cmbench.data.adapter import build_adapter
    from cmbench.runs.evaluator import ModelEvaluator, VideoOutput
    from cmbench.spec import resolve_run
    from test_run_command import SMALL_SUITE
    from test_tiny_backbone import random_model

    tmp = tmp_path_factory.mktemp("miniworld_evaluator")
    weights = tmp / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    cfg = compose_config("decoprune", [f"data.root={tmp / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}",
                                       "generation.continuation_frames=4"])
    build_adapter(cfg.data).ensure()
    tasks = load_manifest(str(cfg.data.root), str(cfg.data.manifest))
    context = [t for t in tasks if t.context_id == tasks[0].context_id]
    assert len(context) >= 2
    spec = resolve_run(cfg)
    videos = VideoOutput(tmp / "run", spec.data.fps, spec.outputs.lossless_max_pixels)
    return ModelEvaluator.from_spec(spec, videos), context


def test_tasks_of_one_miniworld_context_share_one_prefill(miniworld, monkeypatch):
    """MiniWorld's tasks of one context have the same context camera: one prefill serves them all."""
    from cmbench.runs import evaluator as evaluator_module

    ev, context = miniworld
    calls = []
    real_prefill = evaluator_module.prefill
    monkeypatch.setattr(evaluator_module, "prefill", lambda *a, **k: calls.append(1) or real_prefill(*a, **k))
    prepared = ev.prepare(context)
    held = prepared.prefilled
    for i, task in enumerate(context):
        ev.evaluate(task, prepared, seed=i)
    assert len(calls) == 1 and prepared.prefilled is held


def test_score_source_mp4_scores_the_saved_mp4_decoded_again(miniworld, monkeypatch):
    """``score_source: mp4`` scores what the authors score (their saved continuation.mp4), not the frames."""
    ev, context = miniworld
    task = context[0]
    prepared = ev.prepare([task])
    scored = []
    real_score = ev.scorer.score_task
    monkeypatch.setattr(ev.scorer, "score_task", lambda t, frames, refs, **k: scored.append(frames) or real_score(t, frames, refs, **k))
    lossless = ev.evaluate(task, prepared, seed=0)
    monkeypatch.setattr(ev, "score_source", "mp4")
    lossy = ev.evaluate(task, prepared, seed=0)
    mp4, _ = read_video(ev.videos.run_dir / "videos" / f"{task.task_id}.mp4")
    mkv, _ = read_video(ev.videos.run_dir / "videos" / f"{task.task_id}.mkv")
    assert lossless["video"].endswith(".mkv") and lossy["video"].endswith(".mp4")
    assert np.array_equal(scored[0], mkv) and np.array_equal(scored[1], mp4)
    assert not np.array_equal(mp4, mkv)  # mp4v is lossy: the two sources differ
    monkeypatch.setattr(ev, "videos", None)  # without saved videos: a temporary mp4, the same frames
    ev.evaluate(task, prepared, seed=0)
    assert np.array_equal(scored[2], mp4)


def test_calibration_prefills_each_task_under_its_own_prompt(lingbot_folder, monkeypatch):
    """The knob search measures PR as ``run`` does: each task's context prefilled under its own prompt
    (the context frames are denoised under the task's prompt), so a task's calibration PR is the same
    whether its context-mate is measured with it or not."""
    from cmbench.backbones.wan.backbone import WanBackbone
    from cmbench.calibration.pruning_ratio import PRMeter
    from cmbench.data import load_manifest
    from cmbench.methods.registry import build_method

    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(lingbot_folder / "configs"))
    cfg = compose_config("decoprune", ["data=cmbench", "backbone=lingbot_tiny", f"data.root={lingbot_folder / 'data'}",
                                       "data.check_counts=false", "generation.continuation_frames=4"])
    tasks = load_manifest(str(cfg.data.root), str(cfg.data.manifest))
    assert [t.task_id for t in tasks] == list(PROMPTS) and len({t.context_id for t in tasks}) == 1
    method = build_method(dict(cfg.method))
    calls: list[tuple[int, str]] = []
    real_denoise = WanBackbone.denoise

    def spy(self, x_t, t, cache, frame_start, cond, *args, **kwargs):
        calls.append((frame_start, cond.continue_prompt))
        return real_denoise(self, x_t, t, cache, frame_start, cond, *args, **kwargs)

    monkeypatch.setattr(WanBackbone, "denoise", spy)
    meter = PRMeter(cfg, tasks)
    together = meter.task_prs(method)
    context_frames = int(meter._encoded(tasks[0]).shape[2])
    in_context = list(dict.fromkeys(prompt for start, prompt in calls if start < context_frames))
    assert in_context == list(PROMPTS.values())  # the context denoised under each task's own prompt, in turn
    alone = [PRMeter(cfg, [task]).task_prs(method)[0] for task in tasks]
    assert together == alone
