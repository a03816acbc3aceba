"""A dynamic MiniWorld: movers on a schedule and lighting, deterministic, never touching the objects."""

import dataclasses

import numpy as np
import pytest

from cmbench.miniworld import SOURCES, object_masks, render_video, sample_camera_path, scene_from_seed
from cmbench.miniworld.dynamics import MOVER_HEIGHT, SPEEDS


@pytest.fixture(scope="module", params=SOURCES)
def pair(request):
    """The static and the dynamic scene of one seed."""
    return scene_from_seed(11, request.param), scene_from_seed(11, request.param, dynamic=True)


def _unlit(scene):
    """The scene with its lighting held at gain 1 (movers only)."""
    return dataclasses.replace(scene, dynamics=dataclasses.replace(scene.dynamics, light=(0.0, 1.0, 0.0, 0.0, 1.0, 0.0)))


def test_a_dynamic_scene_has_the_static_scenes_places_and_objects(pair):
    static, dynamic = pair
    assert static.dynamics is None and dynamic.dynamics is not None
    assert np.array_equal(static.panorama, dynamic.panorama) and np.array_equal(static.labels, dynamic.labels)
    assert [o.description for o in static.objects] == [o.description for o in dynamic.objects]
    assert static.noise_seed == dynamic.noise_seed
    assert static.n_places <= dynamic.dynamics.n_movers <= static.n_places * 3 // 2


def test_dynamic_frames_are_deterministic_and_seed_dependent(pair):
    _, dynamic = pair
    cams = sample_camera_path(np.random.default_rng(0), 64, dynamic.width)
    first = render_video(dynamic, cams, first_frame=30)
    again = render_video(scene_from_seed(11, dynamic.source, dynamic=True), cams, first_frame=30)
    assert np.array_equal(first, again)
    other = render_video(scene_from_seed(12, dynamic.source, dynamic=True), cams, first_frame=30)
    assert not np.array_equal(first, other)
    # rendering a later part on its own gives the same frames as rendering the whole path
    assert np.array_equal(render_video(dynamic, cams[20:], first_frame=50), first[20:])


def test_frames_depend_on_time_where_the_static_world_does_not(pair):
    static, dynamic = pair
    still = np.zeros(96, dtype=np.int64)  # the camera rests on place 0
    if static.source == "synthetic":  # the real source's sensor noise changes every frame already
        assert (render_video(static, still) == render_video(static, still)[0]).all()
    frames = render_video(_unlit(dynamic), still)
    moving = [not np.array_equal(frames[i], frames[i + 1]) for i in range(95)]
    if dynamic.source == "synthetic":
        assert sum(moving) >= 48  # movers cross the view at 0.25-1.5 px per frame
    lit = render_video(dynamic, still).astype(np.float64)
    means = lit.mean(axis=(1, 2, 3))
    assert means.max() - means.min() > 3  # the lighting drifts by several levels over 96 frames


def test_movers_follow_their_paths_and_schedules(pair):
    _, dynamic = pair
    d = dynamic.dynamics
    frames = np.arange(0, 400)
    left, top = d.positions(frames, dynamic.width)
    travelled = (left[200] - left[0]) % dynamic.width
    expected = np.floor(d.x0 + 200 * d.speed) - np.floor(d.x0)
    assert np.array_equal(travelled, expected.astype(np.int64) % dynamic.width)
    assert np.all((SPEEDS[0] <= np.abs(d.speed)) & (np.abs(d.speed) <= SPEEDS[1]))
    assert top.min() >= 0 and top.max() + MOVER_HEIGHT <= 32
    present = d.present(frames)
    assert present.any(axis=0).all() and (~present).any(axis=0).all()  # each one appears and leaves
    for m in range(d.n_movers):  # periodic schedule, on for on_frames of every period
        on = present[: d.period[m], m]
        assert on.sum() == d.on_frames[m]
        assert np.array_equal(d.present(frames + d.period[m])[:, m], present[:, m])


def test_movers_never_cover_an_object_and_lighting_keeps_its_identity(pair):
    static, dynamic = pair
    cams = sample_camera_path(np.random.default_rng(3), 160, static.width)
    base = render_video(static, cams, first_frame=7)
    moved = render_video(_unlit(dynamic), cams, first_frame=7)
    on_objects = np.zeros(base.shape[:3], dtype=bool)
    for obj in static.objects:
        on_objects |= object_masks(static, cams, obj.object_id)
    assert np.array_equal(moved[on_objects], base[on_objects])  # every object pixel untouched
    assert (moved != base).any(axis=3).sum() > 100  # movers did draw on the background
    if static.source == "synthetic":  # exact lighting check without sensor noise
        lit = render_video(dynamic, cams, first_frame=7).astype(np.float64)
        gain = dynamic.dynamics.gain(7 + np.arange(len(cams)))
        expected = np.clip(np.rint(moved * gain[:, None, None, :]), 0, 255)
        assert np.array_equal(lit, expected)


def test_mover_colours_are_saturated_hues_spread_around_the_wheel():
    from cmbench.miniworld.dynamics import _hue_to_rgb, sample_dynamics

    wheel = {0: (255, 0, 0), 1 / 6: (255, 255, 0), 1 / 3: (0, 255, 0), 1 / 2: (0, 255, 255), 2 / 3: (0, 0, 255),
             5 / 6: (255, 0, 255), 1 / 12: (255, 128, 0)}
    for hue, rgb in wheel.items():
        assert tuple(_hue_to_rgb(hue, 1.0)) == rgb, hue
        assert tuple(_hue_to_rgb(hue, 0.5)) == tuple(int(np.rint(c / 2)) for c in rgb), hue
    colours = np.concatenate([sample_dynamics(np.random.default_rng(seed), 64, 256).colour for seed in range(8)])
    assert colours.dtype == np.uint8 and len(colours) >= 48
    assert (colours.min(axis=1) == 0).all()  # saturated
    sextants = {tuple(c > 0.5 * c.max()) for c in colours.astype(float)}
    assert len(sextants) == 6  # reds, yellows, greens, cyans, blues, magentas: the whole wheel
