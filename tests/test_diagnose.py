"""`diagnose`: the x0-vs-clean error per context chunk and step under the full cache, the method's cache and
no history, split by MiniWorld's ground truth of what each chunk shows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from cmbench.backbones.tiny import CameraPlan
from cmbench.paper.diagnose import (
    ARMS,
    COLUMNS,
    diagnose_context,
    diagnosis_rows,
    summarise,
    verdict,
)
from cmbench.generation import GenerationSettings
from cmbench.methods.fullkv import FullKV
from cmbench.methods.streaming import Streaming
from cmbench.miniworld import render_video, sample_scene
from cmbench.miniworld.places import token_places
from test_tiny_backbone import random_model

WORLD = 256
# six chunks of four frames, each at one rest position: A B C D B A (places 64 px apart never overlap)
CAMERA = np.repeat([0, 64, 128, 192, 64, 0], 4)


def test_token_places_follow_the_camera_on_the_wrap_around_panorama():
    places = token_places(np.array([0, 4, 252]), token_rows=2, token_cols=8, width=WORLD)  # 4-px tokens, 64 columns
    assert places.shape == (3, 16)
    assert places[0].tolist() == [*range(8), *range(64, 72)]
    assert places[1, :8].tolist() == list(range(1, 9))  # one camera step = one token column
    assert places[2, :8].tolist() == [63, *range(7)]  # wraps around
    with pytest.raises(ValueError, match="multiples of the token width"):
        token_places(np.array([2]), 2, 8, WORLD)
    assert places.dtype == np.int64  # place ids index per-place tables
    assert token_places(np.array([4]), 1, 8, WORLD).tolist() == [list(range(1, 9))]  # one row of tokens tiles too
    assert token_places(np.array([0.0, 4.0]), 2, 8, WORLD).dtype == np.int64  # offsets read as floats (JSON)
    for rows, cols in [(0, 8), (2, 0), (2, 5), (-2, 8)]:
        with pytest.raises(ValueError, match=f"a {rows}x{cols} token grid does not tile"):
            token_places(np.array([0]), rows, cols, WORLD)


@pytest.fixture(scope="module")
def world():
    model = random_model(seed=5)
    scene = sample_scene(np.random.default_rng(7), "synthetic", WORLD)
    latents = model.encode(torch.from_numpy(render_video(scene, CAMERA)))
    places = token_places(CAMERA, model.geometry.token_rows, model.geometry.token_cols, WORLD)
    return model, latents, places


def diagnose(world, method, latents=None):
    model, base, places = world
    return diagnose_context(model, method, base if latents is None else latents, CameraPlan(CAMERA), seed=3,
                            settings=GenerationSettings(), places=places)


@pytest.fixture(scope="module")
def streaming(world):
    return diagnose(world, Streaming(sink_chunks=1, recent_chunks=1))


def test_groups_follow_the_ground_truth_and_the_methods_cache(world, streaming):
    # Streaming (sink 1, recent 1) holds chunks 0 and 3 when chunk 4 is written: chunk 4 shows B again,
    # last seen in chunk 1 (pruned); chunk 5 shows A, seen in the sink chunk 0 (cached)
    groups = {c: set(g.tolist()) for c, g in streaming.groups.items()}
    assert groups == {0: {"new"}, 1: {"new"}, 2: {"new"}, 3: {"new"}, 4: {"seen_pruned"}, 5: {"seen_cached"}}
    assert set(streaming.ages[4].tolist()) == {3.0} and set(streaming.ages[5].tolist()) == {5.0}
    assert np.isnan(streaming.ages[2]).all()
    full = diagnose(world, FullKV())  # nothing is pruned under FullKV: chunk 4's place is still cached
    assert set(full.groups[4].tolist()) == {"seen_cached"}


def test_arms_see_the_caches_they_name(world, streaming):
    full = diagnose(world, FullKV())
    for chunk in range(6):  # FullKV as the method: its arm is the full-cache arm
        torch.testing.assert_close(full.errors["method"][chunk], full.errors["full"][chunk], rtol=0, atol=0)
    # with Streaming, chunk 4 (whose place was pruned) is predicted from less than the full cache
    assert not torch.equal(streaming.errors["method"][4], streaming.errors["full"][4])
    # chunk 1 sees chunk 0 (sink) under both: the same cache, the same prediction
    torch.testing.assert_close(streaming.errors["method"][1], streaming.errors["full"][1], rtol=0, atol=0)
    # no history is another prediction than the full cache's (a random model: not a better or worse one)
    assert not torch.equal(streaming.errors["none"][5], streaming.errors["full"][5])


def test_the_no_history_arm_reads_no_history(world, streaming):
    model, latents, _ = world
    other = latents.clone()
    other[:, :, :16] = torch.flip(other[:, :, :16], dims=[-1])  # other earlier chunks (0..3), same chunks 4 and 5
    changed = diagnose(world, Streaming(sink_chunks=1, recent_chunks=1), latents=other)
    for chunk in (4, 5):
        torch.testing.assert_close(changed.errors["none"][chunk], streaming.errors["none"][chunk], rtol=0, atol=0)
        assert not torch.equal(changed.errors["full"][chunk], streaming.errors["full"][chunk])


def test_rows_and_summary(streaming):
    rows = pd.DataFrame(diagnosis_rows("ctx", streaming, (999, 957, 899, 702)), columns=list(COLUMNS))
    # 6 chunks x one group each x 3 arms x 4 steps
    assert len(rows) == 6 * 3 * 4 and set(rows["arm"]) == set(ARMS)
    row = rows[(rows["chunk"] == 4) & (rows["arm"] == "method") & (rows["step"] == 2)].iloc[0]
    assert (row["group"], row["tokens"], row["timestep"], row["age_chunks"]) == ("seen_pruned", 256, 899.0, 3.0)
    assert row["error"] == pytest.approx(float(streaming.errors["method"][4][2].mean()))
    summary = summarise(pd.concat([rows, rows.assign(context_id="ctx2", error=rows["error"] * 3)]))
    cell = summary[(summary["arm"] == "none") & (summary["group"] == "new") & (summary["step"] == 0)].iloc[0]
    values = rows[(rows["arm"] == "none") & (rows["group"] == "new") & (rows["step"] == 0)]["error"]
    assert cell["error"] == pytest.approx(2 * values.mean()) and cell["chunks"] == 8 and cell["contexts"] == 2
    assert cell["ci95"] > 0


def _rows(cached: float, pruned: float, new: float, contexts: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame([{"context_id": f"c{c}", "arm": "method", "step": 2, "group": g,
                          "error": v + 0.01 * rng.standard_normal()}
                         for c in range(contexts) for g, v in (("seen_cached", cached), ("seen_pruned", pruned),
                                                                ("new", new))])


def test_verdict_reads_the_paired_differences():
    said, comparisons = verdict(_rows(0.1, 0.5, 0.6), probe_step=2)
    assert said == "holds" and [c.b for c in comparisons] == ["seen_pruned", "new"]
    assert comparisons[0].difference == pytest.approx(-0.4, abs=0.03) and comparisons[0].contexts == 4
    assert verdict(_rows(0.5, 0.1, 0.6), probe_step=2)[0] == "does not hold"
    assert verdict(_rows(0.5, 0.5, 0.5), probe_step=2)[0] == "inconclusive"
    assert verdict(_rows(0.1, 0.5, 0.6, contexts=1), probe_step=2)[0] == "inconclusive"  # one context: no CI
    no_truth = _rows(0.1, 0.5, 0.6).assign(group="all")
    assert verdict(no_truth, probe_step=2)[0] == "cannot be tested here"
    assert math.isnan(verdict(_rows(0.1, 0.5, 0.6), probe_step=1)[1][0].difference)  # no rows at that step


@pytest.mark.slow
def test_the_command_writes_its_files_on_a_small_suite(tmp_path):
    """``python -m cmbench diagnose`` end to end (in-process) on one context of a small MiniWorld suite."""
    from cmbench.cli.base import run_hydra
    from cmbench.cli.diagnose import FILES, execute
    from cmbench.runs.output_folder import MARKER
    from test_run_command import SMALL_SUITE

    weights = tmp_path / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    out = tmp_path / "out"
    (job,) = run_hydra(execute, [f"data.root={tmp_path / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}",
                                 "method=streaming", "task_ids=[syn_001_reappear_01]", f"out={out}"])
    assert job.code == 0 and sorted(p.name for p in out.iterdir()) == sorted([*FILES, MARKER])  # the write guard's
    rows = pd.read_csv(out / "diagnose.csv")
    assert set(rows["context_id"]) == {"videos/synthetic/syn_001"} and set(rows["arm"]) == set(ARMS)
    assert rows["chunk"].nunique() == 6 * 24 // 4 and set(rows["step"]) == {0, 1, 2, 3}
    assert {"new", "seen_cached", "seen_pruned"} <= set(rows["group"])  # a 6-clip context revisits pruned places
    summary = pd.read_csv(out / "diagnose_summary.csv")
    assert len(summary) == len(rows.groupby(["arm", "group", "step"]))
    assert "cannot be" not in (out / "diagnose.md").read_text()


def test_context_places_read_the_rows_camera_plan_or_say_what_the_row_lacks():
    from types import SimpleNamespace

    from cmbench.miniworld.places import context_places
    from cmbench.miniworld.readers import MiniWorldDataError

    row = SimpleNamespace(task_id="t", extra={"miniworld": {"context_camera_x": [0, 4], "panorama_width": WORLD}})
    assert np.array_equal(context_places(row, 2, 8), token_places(np.array([0, 4]), 2, 8, WORLD))
    with pytest.raises(MiniWorldDataError, match=r"^task t: no MiniWorld camera plan \(miniworld\.context_camera_x"):
        context_places(SimpleNamespace(task_id="t", extra={"miniworld": {"panorama_width": WORLD}}), 2, 8)
    for lacking in (SimpleNamespace(task_id="t", extra={}), SimpleNamespace(task_id="t")):  # no extension, no extra
        with pytest.raises(MiniWorldDataError, match=r"^task t has no 'miniworld' extension"):
            context_places(lacking, 2, 8)
