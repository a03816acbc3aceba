"""Calibration by hand, on tiny inputs: where the calibration data is taken from, which tasks a PR
calibration measures and how each one is run, the knob values a method is given, and the head-map scores
pooled from FullKV attention under each context's conditioning and the run's generation settings."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

# imported here, before any test replaces what these modules import from each other
import cmbench.backbones.loading
import cmbench.backbones.memory.run_plan
import cmbench.calibration.pruning_ratio as pruning_ratio
import cmbench.runs.evaluator
import cmbench.runs.runner
import cmbench.spec  # noqa: F401
from cmbench.cache.quantized import StorageFormat, storage_format
from cmbench.calibration.head_map import calibrate_head_scores, paper_check
from cmbench.calibration.pruning_ratio import PRMeter, calibration_config, calibration_tasks, knob_value
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.hashing import task_seed
from cmbench.methods.fullkv import FullKV
from cmbench.methods.knobs import Knob
from fakes import AttentionBackbone, fake_geometry


# --- where the calibration data comes from ---------------------------------------------------------------

def miniworld(root: str | None) -> DictConfig:
    cfg = OmegaConf.create({"data": {"name": "miniworld", "adapter": "miniworld", "root": "/d/miniworld",
                                     "world_seed": 4, "check_counts": True}, "calibration": {"root": root}})
    OmegaConf.set_struct(cfg, True)  # as a composed config is
    return cfg


@pytest.mark.parametrize("root, expected", [(None, "/d/miniworld_calibration"), ("/d/held_out", "/d/held_out")])
def test_miniworld_calibrates_on_the_next_world_seed_without_checking_counts(root, expected):
    """MiniWorld's calibration world: ``calibration.root`` when given (else ``<data.root>_calibration``),
    built with ``world_seed + 1``, its suite counts not checked (a boolean ``false`` in the config)."""
    cal = calibration_config(miniworld(root))
    assert cal.data.root == expected
    assert cal.data.world_seed == 5
    assert cal.data.check_counts is False


def test_the_calibration_refusals_are_one_whole_sentence():
    """A dataset without a calibration world and a calibration folder that is the test suite's are
    refused with their full explanation."""
    official = OmegaConf.create({"data": {"name": "cmbench", "adapter": "cmbench", "root": "/x/CMBench"},
                                 "calibration": {"root": None}})
    with pytest.raises(ConfigError) as err:
        calibration_config(official)
    assert str(err.value) == ("calibration.root is not set: data=cmbench has no built-in calibration world; give a "
                              "folder of calibration contexts in its format (calibration.root=/path), never the "
                              "test suite's")
    official.calibration.root = "/x/CMBench/."
    with pytest.raises(ConfigError) as err:
        calibration_config(official)
    assert str(err.value) == ("calibration.root=/x/CMBench/. is the test suite's folder (data.root): a knob calibrated "
                              "on the test contexts would be tuned on the test; give another folder")


# --- which tasks are measured ----------------------------------------------------------------------------

@pytest.fixture
def task_sources(monkeypatch):
    """``calibration_tasks`` with the suite, the manifest and the sampler replaced by recorders."""
    seen = {}

    class Adapter:
        def __init__(self, data):
            seen["adapter"] = data

        def ensure(self):
            seen["ensured"] = True

    def load_manifest(root, manifest):
        seen["manifest"] = (root, manifest)
        return ["t1", "t2", "t3"]

    def select_tasks(tasks, *, task_ids=None, limit=None, seed=0):
        seen["select"] = (tasks, task_ids, limit, seed)
        return tasks[:limit]

    monkeypatch.setattr(pruning_ratio, "build_adapter", Adapter)
    monkeypatch.setattr(pruning_ratio, "load_manifest", load_manifest)
    monkeypatch.setattr("cmbench.runs.runner.select_tasks", select_tasks)
    cfg = OmegaConf.create({"data": {"root": "/cal", "manifest": "tasks.jsonl"}, "sample_seed": 5})
    return cfg, seen


def test_one_calibration_task_is_the_seeded_sample_of_the_built_suite(task_sources):
    """``calibration.tasks=1`` is allowed: the suite is built or checked, its manifest read from the
    calibration root, and the sample is the one ``run limit=1`` takes with the config's ``sample_seed``."""
    cfg, seen = task_sources
    assert calibration_tasks(cfg, 1) == ["t1"]
    assert seen["adapter"] == cfg.data and seen["ensured"]
    assert seen["manifest"] == ("/cal", "tasks.jsonl")
    assert seen["select"] == (["t1", "t2", "t3"], None, 1, 5)


def test_no_calibration_task_is_refused_before_the_suite_is_touched(task_sources):
    """``calibration.tasks=0`` is a one-line error naming the setting, and nothing is built."""
    cfg, seen = task_sources
    with pytest.raises(ConfigError) as err:
        calibration_tasks(cfg, 0)
    assert str(err.value) == "calibration.tasks=0: expected a positive number of calibration tasks"
    assert seen == {}


# --- how each task is measured ---------------------------------------------------------------------------

def task(task_id: str, context_id: str) -> SimpleNamespace:
    return SimpleNamespace(task_id=task_id, context_id=context_id)


@dataclass(frozen=True)
class SettingsOf:
    """What the spied meter's ``generation_settings`` returns: the block it read, and the storage format the
    meter sets on it, with the cache's row precision."""
    generation: Any
    storage: StorageFormat = StorageFormat()
    cache_dtype: Any = None


@pytest.fixture
def spied_meter(monkeypatch):
    """A :class:`PRMeter` whose backbone, memory plan, encoder, prefill and generation are recorders;
    each task's continuation has a PR fixed by hand."""
    log = {"encode": [], "prefill": [], "continue": [], "built": [], "plans": [], "backbones": []}
    pr = {"a": 0.5, "b": 0.25, "c": 0.75}

    class Backbone:
        def condition(self, t):
            return ("cond", t.task_id)

    def build_backbone(config):
        log["built"].append(config)
        log["backbones"].append(Backbone())
        return log["backbones"][-1]

    def plan_run(cfg, method):
        log["plans"].append((cfg, method))
        return SimpleNamespace(backbone_config=("backbone config", cfg.backbone.name), method=method)

    def encode_context(context, adapter, backbone, t):
        log["encode"].append((context, adapter, backbone, t.task_id))
        return "frames", f"latents of {t.context_id}"

    def prefilled_for(held, t, cond, *, backbone, method, settings, memory, seed):
        log["prefill"].append(dict(latents=held.latents, task=t.task_id, cond=cond, backbone=backbone,
                                   method=method, settings=settings, memory=memory, seed=seed))
        return ("prefilled", t.task_id)

    def fake_continue(backbone, prefilled, cond, n_frames, seed):
        log["continue"].append((backbone, prefilled, cond, n_frames, seed))
        ledger = SimpleNamespace(pruning_ratio=lambda: pr[prefilled[1]])
        return SimpleNamespace(ledger=ledger)

    monkeypatch.setattr("cmbench.backbones.loading.build_backbone", build_backbone)
    monkeypatch.setattr("cmbench.backbones.memory.run_plan.plan_run", plan_run)
    monkeypatch.setattr("cmbench.runs.evaluator.encode_context", encode_context)
    monkeypatch.setattr("cmbench.runs.evaluator.HeldPrefill", lambda latents: SimpleNamespace(latents=latents))
    monkeypatch.setattr("cmbench.runs.evaluator.prefilled_for", prefilled_for)
    monkeypatch.setattr("cmbench.spec.generation_settings", SettingsOf)
    monkeypatch.setattr(pruning_ratio, "build_adapter", lambda data: ("adapter of", data))
    monkeypatch.setattr(pruning_ratio, "continue_task", fake_continue)
    cfg = OmegaConf.create({"data": {"root": "/cal"}, "backbone": {"name": "tiny", "context": {"frames": 8}},
                            "generation": {"continuation_frames": 4}, "seed": 7})
    progress = []
    tasks = [task("a", "ctx1"), task("b", "ctx2"), task("c", "ctx1")]
    meter = PRMeter(cfg, tasks, on_task=lambda done, total: progress.append((done, total)))
    return meter, cfg, log, progress


def test_the_meter_reports_each_tasks_pr_in_task_order_and_their_mean(spied_meter):
    """Tasks sharing a context run together (a, c then b) but the PRs come back in task order, the
    measurement is their mean, and progress counts the tasks done of all of them."""
    meter, cfg, log, progress = spied_meter
    method = object()
    assert meter.task_prs(method) == [0.5, 0.25, 0.75]
    assert [p["task"] for p in log["prefill"]] == ["a", "c", "b"]
    assert progress == [(1, 3), (2, 3), (3, 3)]
    other = object()
    assert meter(other) == pytest.approx(0.5)  # (0.5 + 0.25 + 0.75) / 3
    assert [plan[1] for plan in log["plans"]] == [method, other]  # each measurement runs the method it is given


def test_each_task_runs_as_the_evaluator_runs_it(spied_meter):
    """Every task is prefilled from its context's latents under its own conditioning with the run's
    method, settings, memory plan and seed, then continued for ``continuation_frames`` with its task
    seed, on the backbone the plan names."""
    meter, cfg, log, _ = spied_meter
    method = object()
    meter.task_prs(method)
    (backbone,) = log["backbones"]
    assert log["built"] == [("backbone config", "tiny")] and log["plans"] == [(cfg, method)]
    plan = SimpleNamespace(backbone_config=("backbone config", "tiny"), method=method)
    for entry, (tid, ctx) in zip(log["prefill"], [("a", "ctx1"), ("c", "ctx1"), ("b", "ctx2")]):
        assert entry == dict(latents=f"latents of {ctx}", task=tid, cond=("cond", tid), backbone=backbone,
                             method=method, settings=SettingsOf(cfg.generation), memory=plan, seed=7)
    assert log["continue"] == [(backbone, ("prefilled", tid), ("cond", tid), 4, task_seed(7, tid))
                               for tid in ("a", "c", "b")]


def test_each_task_runs_in_the_runs_storage_format(spied_meter):
    """The cache of every calibration task stores its history in the run's ``storage`` format, so a bytes
    target is measured in the bytes the run stores; its knobs are checked as ``run`` checks them."""
    _, cfg, log, _ = spied_meter
    kivi = {"name": "kivi", "bits": 2, "group_size": 16, "residual": 64}
    meter = PRMeter(OmegaConf.merge(cfg, {"storage": kivi}), [task("a", "ctx1"), task("b", "ctx2")])
    meter.task_prs(object())
    assert [entry["settings"].storage for entry in log["prefill"]] == [storage_format(kivi)] * 2
    assert storage_format(kivi).quantized and storage_format(kivi) != StorageFormat()
    with pytest.raises(ConfigError, match="storage.bits"):
        PRMeter(OmegaConf.merge(cfg, {"storage": {**kivi, "bits": 3}}), [task("a", "ctx1")])


def test_each_context_is_encoded_once_and_the_backbone_built_once_across_measurements(spied_meter):
    """A context is read and encoded once, from its first task, with the backbone config's context
    block, the calibration data's adapter and the built backbone; a second measurement reuses both."""
    meter, cfg, log, _ = spied_meter
    meter.task_prs(object())
    meter.task_prs(object())
    (backbone,) = log["backbones"]
    adapter = ("adapter of", cfg.data)
    assert log["encode"] == [(cfg.backbone.context, adapter, backbone, "a"), (cfg.backbone.context, adapter, backbone, "b")]
    assert len(log["plans"]) == 2


def test_a_meter_without_tasks_is_refused_naming_the_calibration_folder():
    """An empty calibration sample is an error naming the folder it came from."""
    cfg = OmegaConf.create({"data": {"root": "/cal"}, "generation": {"continuation_frames": 4}})
    with pytest.raises(ConfigError) as err:
        PRMeter(cfg, [])
    assert str(err.value) == "no calibration tasks in /cal"


@pytest.mark.parametrize("integer, value, expected", [(True, 2.6, 3), (True, 2.4, 2), (False, 2.6, 2.6), (False, 3, 3.0)])
def test_a_knob_value_is_whole_for_an_integer_knob_and_a_float_otherwise(integer, value, expected):
    """The method receives an int (rounded to nearest) for a whole-valued knob, a float for the others."""
    got = knob_value(Knob("k", 1, 10, integer=integer), value)
    assert got == expected and type(got) is type(expected)


# --- head maps -------------------------------------------------------------------------------------------

class ConditionedBackbone(AttentionBackbone):
    """The attention model with its input scaled by the conditioning (a number), so what it attends to
    depends on the conditioning it is given."""

    def denoise(self, x_t, t, cache, frame_start, cond=None):
        return super().denoise(x_t * cond, t, cache, frame_start)


def pooled_by_hand(backbone, contexts, settings, first=4, last=4):
    """The Appendix B pooling, FullKV attention of each context's first continuation call: the mass on
    the last ``last`` context frames over the mass on context frames ``first ..``."""
    numerators, denominators = [], []
    for latents, cond, seed in contexts:
        pre = prefill(backbone, FullKV(), latents, cond, seed, settings)
        mass = continue_task(backbone, pre, cond, 2, seed, record_attention_at=(0,)).attention[0].stacked()
        q0 = latents.shape[2]
        numerators.append(mass[..., q0 - last : q0].sum(-1))
        denominators.append(mass[..., first:q0].sum(-1))
    return sum(numerators) / sum(denominators)


@pytest.mark.parametrize("window", [{}, {"first": 2, "last": 6}], ids=["default 4 and 4", "first 2, last 6"])
def test_head_scores_use_each_contexts_conditioning_the_given_settings_and_window(window):
    """Each calibration context is prefilled and continued under its own conditioning and the settings
    passed in (here a re-index that squeezes the context into 4 frames), not the defaults, and scored over
    the ``first`` / ``last`` frames asked (4 and 4 by default)."""
    backbone = ConditionedBackbone(fake_geometry(num_heads=3), seed=4)
    contexts = [(torch.randn(1, 3, frames, 4, 4, generator=torch.Generator().manual_seed(i)), scale, i)
                for i, (frames, scale) in enumerate([(12, 0.5), (20, 2.0)])]
    settings = GenerationSettings(reindex_recent=2, reindex_virtual_length=4.0)
    want = pooled_by_hand(backbone, contexts, settings, **window)
    torch.testing.assert_close(calibrate_head_scores(backbone, contexts, settings, **window), want)
    assert (want - pooled_by_hand(backbone, contexts, None, **window)).abs().max() > 1e-3  # the settings matter here


def test_head_scores_need_a_context():
    """No calibration context is a one-line error."""
    with pytest.raises(ConfigError) as err:
        calibrate_head_scores(AttentionBackbone(fake_geometry()), [])
    assert str(err.value) == "head-map calibration needs at least one context"


@pytest.mark.parametrize("static, layers, heads, expected", [
    (232, 40, 40, "check: 232 static of 1600 layer-heads; the paper's LingBot map: 232 (matches)"),
    (230, 40, 40, "check: 230 static of 1600 layer-heads; the paper's LingBot map: 232 (differs by -2)"),
    (3, 4, 4, "check: the paper's LingBot World v2 map has 232 static of 1600 layer-heads; this backbone has 4 x 4, "
              "so there is no paper count to compare"),
])
def test_the_paper_check_line(static, layers, heads, expected):
    """The head-map command's last line: the static count beside the paper's 232 of 40 x 40 = 1600
    layer-heads, or why there is nothing to compare."""
    assert paper_check(static, layers, heads) == expected
