"""One context and its tasks through :class:`ModelEvaluator`, with every heavy piece (backbone, scorer, adapter,
memory plan, prefill, continuation, video files) replaced by a scripted stand-in: what each piece is given
(the context shape, seeds, conditioning, which frames are scored), when a prefill is shared or rebuilt, where
videos go and when a lossless copy is written, and every field of a task's result, with the attention work
worked out by hand from the documented formulas."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cmbench.data.adapter import ContextFrames, ContextShape
from cmbench.data.references import ReferenceFrameError
from cmbench.data.task import Reference, Task
from cmbench.errors import ConfigError
from cmbench.hashing import task_seed
from cmbench.runs import evaluator as ev_module
from cmbench.runs.evaluator import (
    HeldPrefill,
    ModelEvaluator,
    VideoOutput,
    context_shape,
    encode_context,
    prefilled_for,
)
from cmbench.runs.records import scored_fields
from cmbench.scoring.pipeline import TaskScore

# 1 layer x 1 head of width 2, 5 tokens per latent frame, chunks of 3 latent frames
GEOMETRY = SimpleNamespace(num_layers=1, num_heads=1, head_dim=2, tokens_per_frame=5, chunk_frames=3)


def _task(task_id: str, context: str = "c0", cond: str = "same", frame_index: int = 2) -> Task:
    """A task of context ``videos/<context>``; ``cond`` is what :class:`Backbone` conditions (and keys a prefill)
    on; one reference, annotated at frame ``frame_index`` (its timestamp, 0 s, points at frame 0)."""
    ref = Reference(timestamp_seconds=0.0, bbox_xyxy_normalized=(0.0, 0.0, 1.0, 1.0), frame_index=frame_index)
    return Task(task_id=task_id, source="real", scene="s", video=f"videos/{context}.mp4",
                context_clip_prompts=("p",) * 6, continue_prompt="go on", task_type="revisit", target_label="cup",
                target_aliases=(), references=(ref,), extra={"cond": cond})


class Backbone:
    """Conditions on ``task.extra["cond"]``, keys a prefill on (cond, context frames), encodes to fixed latents
    ``[1, 2, 3, 1, 1]`` and decodes any continuation after its context to 6 frames of 4 x 6 pixels."""

    geometry = GEOMETRY

    def __init__(self, log: list):
        self.log = log

    def condition(self, task):
        return task.extra["cond"]

    def prefill_key(self, cond, context_frames):
        return cond, context_frames

    def encode(self, video):
        self.log.append(("encode", video))
        return torch.full((1, 2, 3, 1, 1), 0.5)

    def decode_continuation(self, latents, context):
        self.log.append(("decode", latents, context))
        return torch.arange(6 * 4 * 6 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(6, 4, 6, 3)


class Scorer:
    """Scores every continuation 0.5 (frames found: 1 of 2), logging what it was given."""

    config_hash = "scorer-hash"

    def __init__(self, log: list):
        self.log = log

    def score_task(self, task, frames, refs, frames_defined=None):
        self.log.append(("score", task.task_id, frames, refs))
        self.log.append(("frames_defined", frames_defined))
        return TaskScore(task_id=task.task_id, source=task.source, task_type=task.task_type, score=0.5,
                         similarities=[None, 0.5], detection_rate=0.5, boxes=[None, [0, 0, 1, 1]],
                         detection_scores=[None, 0.9], detection_threshold=0.3, reference_mask_fallback=[False],
                         n_frames=2, scorer="light", scorer_config_hash=self.config_hash)


class Adapter:
    """A context of 3 frames to prefill; the stored context has 4 frames, frame ``i`` filled with ``i``."""

    def __init__(self, log: list):
        self.log = log

    def context(self, task, shape):
        self.log.append(("context", task.task_id, shape))
        frames = np.zeros((3, 8, 12, 3), dtype=np.uint8)[:, :, ::-1]  # a view, not contiguous
        stored = np.stack([np.full((2, 2, 3), i, dtype=np.uint8) for i in range(4)])
        return ContextFrames(frames=frames, reference_source=stored, reference_fps=5.0)


def _continuation(store=None, seconds: float = 2.0) -> SimpleNamespace:
    """A continuation of 4 latent frames (batch 2), kept tokens per chunk 0..3 = 3, 4, 5, 6."""
    ledger = {"pruning_ratio": 0.4, "peak_stored_bytes": 1024.0, "peak_store_bytes": 2048.0,
              "moved_bytes_per_chunk": 64.0, "mean_stored_bytes": 768.0, "mean_full_bytes": 1280.0,
              "peak_full_bytes": 2560.0, "kv_bytes_ratio": 0.6}
    return SimpleNamespace(latents=torch.zeros(2, 3, 4, 1, 1), cache=SimpleNamespace(store=store, row_dtype=torch.bfloat16),
                           ledger=SimpleNamespace(summary=lambda: ledger, rows=lambda: [[3, 4], [5, 6]]), kept_tokens={0: 3, 1: 4, 2: 5, 3: 6},
                           seconds=seconds)


@pytest.fixture
def fakes(monkeypatch):
    """Every heavy piece the evaluator module calls, scripted; ``log`` lists the calls in order, ``videos`` the
    files written (path -> frames), ``next_cont`` is what the next continuation returns, and ``make(**kw)``
    builds a :class:`ModelEvaluator` (seed 3, data at 5 fps, 6 continuation frames)."""
    log: list = []
    videos: dict = {}
    state = SimpleNamespace(log=log, videos=videos, next_cont=_continuation(), prefills=0)
    memory = SimpleNamespace(backbone_config={"name": "resolved"}, settle=lambda cache: log.append(("settle", cache)))

    def plan_run(inputs, method):
        log.append(("plan_run", inputs, method))
        return memory

    def build_backbone(config):
        log.append(("build_backbone", config))
        return Backbone(log)

    def prefill(backbone, method, latents, cond, seed, settings):
        state.prefills += 1
        log.append(("prefill", cond, seed, settings))
        log.append(("prefill_inputs", backbone, method, latents))
        return SimpleNamespace(cache=f"cache{state.prefills}", next_chunk=2, seconds=1.5,
                               ledger=SimpleNamespace(pruning_ratio=lambda: 0.25))

    def continue_task(recorder, prefilled, cond, frames, seed):
        log.append(("continue", prefilled.cache, cond, frames, seed))
        recorder.calls.append(5)  # visible history keys, summed over layer-heads
        recorder.lengths.append(2)  # tokens of the chunk denoised
        return state.next_cont

    def write_file(path, frames):
        """The frames into a real file too, so a video written to a temporary and renamed into place
        (the link-safe writes) is found under its final name."""
        videos[Path(path)] = frames
        with open(path, "wb") as handle:
            np.save(handle, frames)

    def write_video(path, frames, fps):
        log.append(("write_video", Path(path), fps))
        write_file(path, frames)
        return Path(path)

    def write_lossless_video(path, frames, fps):
        log.append(("write_lossless", Path(path), fps))
        write_file(path, frames)

    def read_video(path):
        log.append(("read_video", Path(path)))
        frames = videos[Path(path)] if Path(path) in videos else np.load(path)
        return frames // 2, {"fps": "as written"}  # the decoded mp4 differs from the frames

    monkeypatch.setattr(ev_module, "check_settings", lambda method, settings: log.append(("check", method, settings)))
    monkeypatch.setattr(ev_module, "plan_inputs", lambda *args: ("inputs", *args))
    monkeypatch.setattr(ev_module, "plan_run", plan_run)
    monkeypatch.setattr(ev_module, "build_scorer", lambda config: log.append(("build_scorer", config)) or Scorer(log))
    monkeypatch.setattr(ev_module, "build_adapter", lambda config: log.append(("build_adapter", config)) or Adapter(log))
    monkeypatch.setattr(ev_module, "build_backbone", build_backbone)
    monkeypatch.setattr(ev_module, "check_heads", lambda *args: log.append(("check_heads", *args)))
    monkeypatch.setattr(ev_module, "split_backbone", lambda backbone, group: log.append(("split", backbone, group)))
    monkeypatch.setattr(ev_module, "prefill", prefill)
    monkeypatch.setattr(ev_module, "continue_task", continue_task)
    monkeypatch.setattr(ev_module, "write_video", write_video)
    monkeypatch.setattr(ev_module, "write_lossless_video", write_lossless_video)
    monkeypatch.setattr(ev_module, "read_video", read_video)

    generation = SimpleNamespace(settings="settings", continuation_frames=6)
    data = SimpleNamespace(config={"name": "data"}, fps=5.0)
    backbone = {"context": {"fps": 10, "height": "8", "width": 12.0}}
    scorer = {"name": "light"}
    state.spec = SimpleNamespace(method="method", generation=generation, data=data, backbone=backbone, scorer=scorer,
                                 selection=SimpleNamespace(seed=3), score_source="frames",
                                 parallel=SimpleNamespace(sequence=1))

    def make(**kwargs) -> ModelEvaluator:
        kwargs.setdefault("seed", 3)
        return ModelEvaluator("method", generation, data, backbone, scorer, **kwargs)

    state.make = make
    return state


def _calls(log: list, name: str) -> list[tuple]:
    """The logged calls named ``name``, without their name."""
    return [entry[1:] for entry in log if entry[0] == name]


def _exact(values) -> list[tuple[str, object]]:
    """Values with their types, so ``8.0`` does not pass for ``8``."""
    return [(type(v).__name__, v) for v in values]


# ------------------------------------------------------------------------------------------ the context
def test_the_context_shape_comes_from_the_backbone_config_and_its_chunk_size():
    backbone = SimpleNamespace(geometry=GEOMETRY)
    shape = context_shape({"fps": "8", "height": "32", "width": 48.0}, backbone)
    assert _exact([shape.fps, shape.height, shape.width, shape.chunk_latent_frames, shape.temporal_stride]) == \
        _exact([8.0, 32, 48, 3, 4])  # a VAE's temporal stride of 4 unless the config says
    assert context_shape({"fps": 8, "height": 32, "width": 48, "temporal_stride": "1"}, backbone).temporal_stride == 1


def test_a_context_is_read_at_the_backbones_shape_and_encoded_from_contiguous_frames():
    log: list = []
    task = _task("a")
    frames, latents = encode_context({"fps": 10, "height": 8, "width": 12}, Adapter(log), Backbone(log), task)
    assert log[0] == ("context", "a", ContextShape(10.0, 8, 12, 3, 4))
    video = log[1][1]
    assert isinstance(video, torch.Tensor) and video.shape == (3, 8, 12, 3) and video.dtype == torch.uint8
    assert frames.frames.shape == (3, 8, 12, 3) and torch.equal(latents, torch.full((1, 2, 3, 1, 1), 0.5))


# --------------------------------------------------------------------------------------------- prefills
def _held_prefill(monkeypatch, backbone) -> tuple[HeldPrefill, list]:
    """A held context of 3 latent frames and a scripted ``prefill`` whose calls (cond, seed, and what was
    still held when it ran; whether it was given ``backbone``, method "m", the held latents and settings "s")
    are returned."""
    calls: list = []
    held = HeldPrefill(torch.zeros(1, 2, 3, 1, 1))

    def prefill(bb, method, latents, cond, seed, settings):
        assert (bb is backbone, method, latents is held.context_latents, settings) == (True, "m", True, "s")
        calls.append((cond, seed, held.prefilled))
        return SimpleNamespace(cache=f"cache{len(calls)}")

    monkeypatch.setattr(ev_module, "prefill", prefill)
    return held, calls


def test_a_prefill_is_shared_while_its_key_holds_and_replaced_when_it_changes(monkeypatch):
    backbone = Backbone([])
    held, calls = _held_prefill(monkeypatch, backbone)
    settled: list = []
    memory = SimpleNamespace(settle=settled.append)

    def get(task):
        return prefilled_for(held, task, task.extra["cond"], backbone=backbone, method="m", settings="s",
                             memory=memory, seed=9)

    first = get(_task("a", "c1", cond="x"))
    assert get(_task("b", "c1", cond="x")) is first  # same key: shared
    assert held.key == ("backbone", ("x", 3))  # the backbone's key: (cond, latent context frames)
    third = get(_task("c", "c1", cond="y"))
    assert third is not first and held.prefilled is third and held.key == ("backbone", ("y", 3))
    # every prefill of a context is seeded by the context (not the task); the old one is let go first
    assert calls == [("x", task_seed(9, "videos/c1"), None), ("y", task_seed(9, "videos/c1"), None)]
    assert settled == ["cache1", "cache2"]


def test_a_held_key_without_a_prefill_is_prefilled(monkeypatch):
    """A backbone that does not say what its prefill reads: one prefill per task, keyed by its id."""
    backbone = SimpleNamespace()
    held, calls = _held_prefill(monkeypatch, backbone)
    held.key = ("task", "a")
    got = prefilled_for(held, _task("a"), None, backbone=backbone, method="m", settings="s",
                        memory=SimpleNamespace(settle=lambda cache: None), seed=0)
    assert got.cache == "cache1" and len(calls) == 1
    assert held.key == ("task", "a")
    prefilled_for(held, _task("b"), None, backbone=backbone, method="m", settings="s",
                  memory=SimpleNamespace(settle=lambda cache: None), seed=0)
    assert len(calls) == 2 and held.key == ("task", "b")


# ----------------------------------------------------------------------------------------- construction
def test_building_plans_memory_first_then_builds_each_piece_from_its_config(fakes):
    ev = fakes.make()
    assert fakes.log == [
        ("check", "method", "settings"),
        ("plan_run", ("inputs", fakes.spec.backbone, fakes.spec.data, fakes.spec.scorer, fakes.spec.generation, 1),
         "method"),
        ("build_scorer", {"name": "light"}),
        ("build_adapter", {"name": "data"}),
        ("build_backbone", {"name": "resolved"}),  # the memory plan's backbone config (offloads set)
        ("check_heads", 1, 5, 1),  # heads, tokens per frame, ranks
    ]
    assert (ev.metric, ev.scorer_hash, ev.score_source, ev.videos, ev.group) == (
        "light", "scorer-hash", "frames", None, None)
    assert ev.context_shape() == ContextShape(10.0, 8, 12, 3, 4)


def test_from_spec_passes_the_seed_score_source_and_ranks(fakes, tmp_path):
    fakes.spec.score_source, fakes.spec.parallel.sequence = "mp4", 2
    videos = VideoOutput(tmp_path, 12.0)
    ev = ModelEvaluator.from_spec(fakes.spec, videos)
    assert (ev.seed, ev.score_source, ev.videos, ev.method) == (3, "mp4", videos, "method")
    assert _calls(fakes.log, "plan_run")[0][0][-1] == 2 and _calls(fakes.log, "check_heads") == [(1, 5, 2)]
    assert ModelEvaluator.from_spec(fakes.spec).videos is None


def test_an_unknown_score_source_is_refused_naming_the_choices(fakes):
    with pytest.raises(ConfigError) as err:
        fakes.make(score_source="png")
    assert str(err.value) == "score_source must be one of frames, mp4, got 'png'"


def test_a_video_output_writes_no_lossless_copy_unless_asked(tmp_path):
    assert VideoOutput(tmp_path, 8.0).lossless_max_pixels == 0


# ----------------------------------------------------------------------------------------------- videos
FRAMES = np.zeros((6, 4, 6, 3), dtype=np.uint8)  # 4 x 6 = 24 pixels a frame


@pytest.mark.parametrize("most,source,want", [
    (24, "frames", "mkv"),  # at most 24 pixels: a lossless copy too, which is scored
    (23, "frames", "mp4"),
    (0, "frames", "mp4"),
    (24, "mp4", "mp4"),  # the mp4 is what is scored: no lossless copy
])
def test_a_continuation_is_saved_as_mp4_and_small_ones_losslessly_too(fakes, tmp_path, most, source, want):
    ev = fakes.make(videos=VideoOutput(tmp_path, 12.0, most), score_source=source)
    assert ev.save(_task("t1"), FRAMES) == f"videos/t1.{want}"
    written = [(tmp_path / "videos" / "t1.mp4", 12.0)] + ([(tmp_path / "videos" / "t1.mkv", 12.0)] if want == "mkv"
                                                          else [])
    calls = _calls(fakes.log, "write_video") + _calls(fakes.log, "write_lossless")
    # each written to a new hidden file beside its target (keeping the suffix the writer picks the
    # container by), then renamed over the target: never written through what is at the target
    assert [(_renamed_to(path), fps) for path, fps in calls] == written
    assert all(not path.exists() for path, _ in calls) and all(path.is_file() for path, _ in written)
    assert all(np.array_equal(np.load(path), FRAMES) for path, _ in written)
    assert all(frames is FRAMES for frames in fakes.videos.values())


def _renamed_to(tmp: Path) -> Path:
    """The target of a temporary written beside it (``.<name>.<hex>.tmp<suffix>``)."""
    match = re.fullmatch(r"\.(.+)\.[0-9a-f]{8}\.tmp(\.\w+)", tmp.name)
    assert match and match.group(1).endswith(match.group(2)), tmp.name
    return tmp.parent / match.group(1)


def test_nothing_is_saved_without_a_video_output(fakes):
    assert fakes.make().save(_task("t1"), FRAMES) is None
    assert _calls(fakes.log, "write_video") == []


def test_a_task_id_that_would_leave_the_run_directory_is_refused(fakes, tmp_path):
    ev = fakes.make(videos=VideoOutput(tmp_path / "run", 12.0))
    with pytest.raises(ConfigError, match="outside"):
        ev.save(_task("../../escape"), FRAMES)


def test_mp4_frames_are_read_back_from_the_saved_video(fakes, tmp_path):
    ev = fakes.make(videos=VideoOutput(tmp_path, 12.0))
    fakes.videos[tmp_path / "videos" / "t1.mp4"] = FRAMES + 8
    assert np.array_equal(ev.mp4_frames(_task("t1"), FRAMES), FRAMES + 4)
    assert _calls(fakes.log, "write_video") == []


def test_mp4_frames_go_through_a_temporary_mp4_when_videos_are_not_saved(fakes):
    got = fakes.make().mp4_frames(_task("t1"), FRAMES + 8)
    assert np.array_equal(got, FRAMES + 4)
    ((path, fps),) = _calls(fakes.log, "write_video")
    assert path.name == "continuation.mp4" and fps == 5.0  # the data's frame rate
    assert _calls(fakes.log, "read_video") == [(path,)]
    assert not path.parent.exists()  # the temporary folder is gone


# ------------------------------------------------------------------------------------------- evaluation
def test_prepare_reads_encodes_and_prefills_the_context_for_its_first_task(fakes):
    ev = fakes.make()
    prepared = ev.prepare([_task("a", "c1", cond="x"), _task("b", "c1", cond="y")])
    assert _calls(fakes.log, "context") == [("a", ContextShape(10.0, 8, 12, 3, 4))]
    assert torch.equal(prepared.context_latents, torch.full((1, 2, 3, 1, 1), 0.5))
    assert prepared.context.reference_fps == 5.0
    assert _calls(fakes.log, "prefill") == [("x", task_seed(3, "videos/c1"), "settings")]
    assert _calls(fakes.log, "prefill_inputs") == [(ev.backbone, "method", prepared.context_latents)]
    assert _calls(fakes.log, "settle") == [("cache1",)]
    assert prepared.prefilled.cache == "cache1" and prepared.key == ("backbone", ("x", 3))


def _expected(video=None, **over) -> dict:
    """The result of the scripted task: 6 decoded frames in 2 s; kept tokens 3 + 4 + 5 + 6 = 18, of which the
    context's chunks 0 and 1 (below the prefill's next chunk, 2) hold 3 + 4 = 7.

    Attention work, from the one logged call (5 history keys, a chunk of L = 2 tokens; 1 layer x 1 head of width
    D = 2; batch B = 2; 4 latent frames x 5 tokens = 20 generated tokens):
    FLOPs 4 B L D (n + L) = 4 * 2 * 2 * 2 * (5 + 2) = 224; keys per token L (n + L) / 20 = 2 * 7 / 20 = 0.7.
    """
    score = TaskScore(task_id="a", source="real", task_type="revisit", score=0.5, similarities=[None, 0.5],
                      detection_rate=0.5, boxes=[None, [0, 0, 1, 1]], detection_scores=[None, 0.9],
                      detection_threshold=0.3, reference_mask_fallback=[False], n_frames=2, scorer="light",
                      scorer_config_hash="scorer-hash")
    return {**scored_fields(score), "metric": "light", "video": video, "pr": 0.4, "context_pr": 0.25,
            "kept_tokens": 18, "kept_context_tokens": 7, "peak_kv_bytes": 1024, "prefill_seconds": 1.5,
            "mean_kv_bytes": 768.0, "fullkv_kv_bytes": 1280.0, "fullkv_peak_kv_bytes": 2560, "kv_bytes_ratio": 0.6,
            "continuation_seconds": 2.0, "continuation_frames": 6, "continuation_fps": 3.0,
            "attention_flops": 224.0, "attention_keys_per_token": 0.7, "cache_dtype": "bfloat16", "ledger": [[3, 4], [5, 6]],
            "continuity": None, "suspect": None, **over}  # a task without a camera plan: no continuity check


def test_a_task_result_holds_its_score_cost_and_timings(fakes):
    ev = fakes.make()
    task = _task("a", "c1", cond="x")
    prepared = ev.prepare([task])
    cont = fakes.next_cont
    got = ev.evaluate(task, prepared, seed=17)
    assert got == _expected()
    assert _exact([got["kept_tokens"], got["kept_context_tokens"], got["peak_kv_bytes"]]) == _exact([18, 7, 1024])
    assert cont.cache is None  # the task's cache let go before decoding
    assert _calls(fakes.log, "continue") == [("cache1", "x", 6, 17)]  # the task's own seed, 6 frames
    assert len(_calls(fakes.log, "prefill")) == 1  # the prefill of prepare, shared
    ((latents, context),) = _calls(fakes.log, "decode")
    assert latents is cont.latents and context is prepared.context_latents
    ((task_id, frames, refs),) = _calls(fakes.log, "score")
    assert task_id == "a" and np.array_equal(frames, ev.backbone.decode_continuation(None, None).numpy())
    assert _calls(fakes.log, "frames_defined") == [(len(frames),)]  # the frame-count rule: the frames generated
    assert [int(r[0, 0, 0]) for r in refs] == [2]  # the annotated frame 2 (native), not the timestamp's frame 0


def test_a_task_with_another_conditioning_gets_its_own_prefill(fakes):
    ev = fakes.make()
    prepared = ev.prepare([_task("a", "c1", cond="x")])
    ev.evaluate(_task("b", "c1", cond="y"), prepared, seed=1)
    assert _calls(fakes.log, "prefill") == [("x", task_seed(3, "videos/c1"), "settings"),
                                            ("y", task_seed(3, "videos/c1"), "settings")]
    assert _calls(fakes.log, "continue")[0][:2] == ("cache2", "y")


def test_a_host_store_adds_its_peak_and_transfers(fakes):
    ev = fakes.make()
    fakes.next_cont = _continuation(store=object())
    got = ev.evaluate(_task("a"), ev.prepare([_task("a")]), seed=1)
    assert got == _expected(peak_store_bytes=2048, moved_bytes_per_chunk=64.0)
    assert type(got["peak_store_bytes"]) is int


@pytest.mark.parametrize("seconds,fps", [(0.0, None), (0.5, 12.0)])  # 6 frames in 0.5 s: 12 fps
def test_the_frame_rate_of_a_continuation_and_none_when_it_took_no_time(fakes, seconds, fps):
    ev = fakes.make()
    fakes.next_cont = _continuation(seconds=seconds)
    got = ev.evaluate(_task("a"), ev.prepare([_task("a")]), seed=1)
    assert (got["continuation_fps"], got["continuation_seconds"]) == (fps, seconds)


def test_a_split_model_counts_the_attention_work_of_every_rank(fakes):
    ev = fakes.make()
    group = SimpleNamespace(sum_each=lambda calls: [2 * c for c in calls])  # two ranks, equal halves
    ev.split(group)
    assert ev.group is group and _calls(fakes.log, "split") == [(ev.backbone, group)]
    got = ev.evaluate(_task("a"), ev.prepare([_task("a")]), seed=1)
    # n = 2 * 5 = 10: FLOPs 4 * 2 * 2 * 2 * (10 + 2) = 384; keys per token 2 * 12 / 20 = 1.2
    assert (got["attention_flops"], got["attention_keys_per_token"]) == (384.0, 1.2)


def test_saved_videos_are_named_in_the_result_and_mp4_scoring_scores_the_saved_mp4(fakes, tmp_path):
    ev = fakes.make(videos=VideoOutput(tmp_path, 12.0, 24), score_source="mp4")
    got = ev.evaluate(_task("a"), ev.prepare([_task("a")]), seed=1)
    assert got == _expected(video="videos/a.mp4")
    decoded = ev.backbone.decode_continuation(None, None).numpy()
    ((_, frames, _),) = _calls(fakes.log, "score")
    assert np.array_equal(frames, decoded // 2)  # what read_video gave back, not the decoded frames
    assert _calls(fakes.log, "read_video") == [(tmp_path / "videos" / "a.mp4",)]


def test_mp4_scoring_without_saved_videos_scores_the_decoded_frames_written_to_an_mp4_and_read_back(fakes):
    ev = fakes.make(score_source="mp4")
    got = ev.evaluate(_task("a"), ev.prepare([_task("a")]), seed=1)
    assert got["video"] is None
    decoded = ev.backbone.decode_continuation(None, None).numpy()
    ((path, _),) = _calls(fakes.log, "write_video")
    assert np.array_equal(fakes.videos[path], decoded)
    ((_, frames, _),) = _calls(fakes.log, "score")
    assert np.array_equal(frames, decoded // 2)


def test_frames_scoring_scores_the_decoded_frames_even_when_a_lossless_copy_is_saved(fakes, tmp_path):
    ev = fakes.make(videos=VideoOutput(tmp_path, 12.0, 24))
    got = ev.evaluate(_task("a"), ev.prepare([_task("a")]), seed=1)
    assert got["video"] == "videos/a.mkv"
    assert _calls(fakes.log, "read_video") == []


def test_a_reference_outside_the_context_names_its_frame_and_rate(fakes):
    ev = fakes.make()
    task = _task("a", frame_index=7)
    with pytest.raises(ReferenceFrameError, match=r"reference 0 is frame 7 \(t=0.0s at 5 fps\) but the context "
                                                  r"video has 4 frames"):
        ev.evaluate(task, ev.prepare([task]), seed=1)
