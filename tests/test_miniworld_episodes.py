"""MiniWorld episodes: exact task allocation, and context/continuation plans checked on the renderer."""

import re
from collections import Counter

import numpy as np
import pytest

from cmbench.miniworld import object_masks, scene_from_seed
from cmbench.miniworld.episodes import EpisodeConfig, allocate_tasks, continue_prompt, plan_episode

CFG = EpisodeConfig()


def test_allocation_hits_the_official_split_exactly():
    for contexts, reappear, revisit in ((50, 67, 35), (8, 10, 4)):
        plan = allocate_tasks(contexts, reappear, revisit, np.random.default_rng(0), max_per_context=5)
        assert len(plan) == contexts
        flat = Counter(t for types in plan for t in types)
        assert flat == {"reappear": reappear, "revisit": revisit}
        sizes = Counter(len(types) for types in plan)
        n_tasks = reappear + revisit
        # as even as possible: every context gets floor or ceil of the mean
        assert set(sizes) <= {n_tasks // contexts, -(-n_tasks // contexts)}
        assert max(types.count("revisit") for types in plan) == -(-revisit // contexts)
    assert Counter(len(t) for t in allocate_tasks(50, 67, 35, np.random.default_rng(0), 5)) == {2: 48, 3: 2}
    assert Counter(len(t) for t in allocate_tasks(8, 10, 4, np.random.default_rng(0), 5)) == {2: 6, 1: 2}


def test_allocation_refuses_impossible_counts():
    with pytest.raises(ValueError, match="cannot be spread"):
        allocate_tasks(10, 3, 2, np.random.default_rng(0), 5)  # fewer tasks than contexts
    with pytest.raises(ValueError, match="cannot be spread"):
        allocate_tasks(2, 9, 2, np.random.default_rng(0), 5)  # more than 5 per context


def _check_pans_are_told(scene, episode, cfg):
    """Each clip's prompt tells its pans in order, each with the direction the camera turns (right: x grows)
    and its pace (slowly: 4 px a frame, quickly: 8)."""
    x = episode.context_x
    step = (np.diff(x) + scene.width // 2) % scene.width - scene.width // 2  # the signed shorter way round
    for clip, prompt in enumerate(episode.clip_prompts):
        moves = step[max(0, clip * cfg.clip_frames - 1) : (clip + 1) * cfg.clip_frames - 1]
        starts = [i for i, v in enumerate(moves) if v and (i == 0 or not moves[i - 1])]  # a pan: steps between holds
        runs = [(int(np.sign(moves[i])), abs(int(moves[i]))) for i in starts]  # (a quick pan may land on a 4-px step)
        told = re.findall(r"pans (\w+) (\w+) to", prompt)
        assert told == [("right" if d > 0 else "left", "slowly" if speed == 4 else "quickly") for d, speed in runs], prompt


def _check_episode(scene, episode, task_types, cfg=CFG):
    x = episode.context_x
    assert x.shape == (cfg.context_frames,) and x.dtype == np.int64
    assert (x % 4 == 0).all()
    step = np.abs(np.diff(x))
    assert set(np.minimum(step, scene.width - step).tolist()) <= {0, 4, 8}
    assert len(episode.clip_prompts) == cfg.clips and all(p.startswith(("The camera", "A wrap")) for p in episode.clip_prompts)
    _check_pans_are_told(scene, episode, cfg)
    assert [t.task_type for t in episode.tasks] == list(task_types)
    assert len({t.target_id for t in episode.tasks}) == len(task_types)
    for task in episode.tasks:
        target = scene.objects[task.target_id]
        masks = object_masks(scene, x, task.target_id)
        pixels = masks.sum(axis=(1, 2))
        clip = np.arange(len(x)) // cfg.clip_frames
        # never in the sink, the recent window, nor the last clip; whole in the reference frame
        assert pixels[: cfg.sink_frames].sum() == 0
        assert pixels[-cfg.recent_window_frames :].sum() == 0 and pixels[-cfg.min_absence_frames :].sum() == 0
        assert pixels[task.reference_frame] == target.area
        assert clip[task.reference_frame] == task.event_clip
        assert pixels[clip < task.event_clip].sum() == 0  # first seen in its event clip
        if task.task_type == "revisit":  # A -> B -> A inside one clip, B seen nowhere else
            assert pixels[clip != task.event_clip].sum() == 0
            frames = x[clip == task.event_clip]
            assert frames[0] == frames[-1]
            assert object_masks(scene, frames[:1], task.target_id).sum() == 0
        plan = task.continuation_x
        assert plan.shape == (cfg.continuation_frames,) and (plan % 4 == 0).all()
        first_step = min(abs(int(plan[0]) - int(x[-1])), scene.width - abs(int(plan[0]) - int(x[-1])))
        assert first_step in (0, 4, 8)
        shown = object_masks(scene, plan, task.target_id).sum(axis=(1, 2))
        assert (shown == target.area).sum() >= cfg.min_target_frames and shown[-1] == target.area
        assert target.category in continue_prompt(task, scene) and target.appearance not in continue_prompt(task, scene)


@pytest.mark.parametrize("source", ["synthetic", "real"])
@pytest.mark.parametrize(
    "task_types",
    [["reappear"], ["revisit"], ["revisit", "reappear"], ["reappear", "reappear"], ["revisit", "reappear", "reappear"]],
)
def test_plans_satisfy_every_memory_constraint(source, task_types):
    for seed in range(3):
        scene = scene_from_seed(100 + seed, source)
        episode = plan_episode(scene, task_types, np.random.default_rng(seed))
        _check_episode(scene, episode, task_types)


def test_plans_are_deterministic_and_seed_dependent():
    scene = scene_from_seed(5)
    a = plan_episode(scene, ["revisit", "reappear"], np.random.default_rng(1))
    b = plan_episode(scene, ["revisit", "reappear"], np.random.default_rng(1))
    c = plan_episode(scene, ["revisit", "reappear"], np.random.default_rng(2))
    assert np.array_equal(a.context_x, b.context_x) and a.clip_prompts == b.clip_prompts
    assert all(np.array_equal(s.continuation_x, t.continuation_x) for s, t in zip(a.tasks, b.tasks))
    assert not np.array_equal(a.context_x, c.context_x)


def test_other_episode_shapes_work():
    cfg = EpisodeConfig(clips=4, clip_frames=24, continuation_frames=12, min_absence_frames=16)
    scene = scene_from_seed(9, width=320)
    episode = plan_episode(scene, ["revisit", "reappear"], np.random.default_rng(0), cfg)
    _check_episode(scene, episode, ["revisit", "reappear"], cfg)


def test_bad_episode_requests_are_refused():
    scene = scene_from_seed(0)
    with pytest.raises(ValueError, match="task types"):
        plan_episode(scene, ["recall"], np.random.default_rng(0))
    with pytest.raises(ValueError, match="do not fit"):
        plan_episode(scene, ["reappear"] * 6, np.random.default_rng(0))
    with pytest.raises(ValueError, match="min_absence_frames"):
        EpisodeConfig(min_absence_frames=4)
