"""MiniWorld world and renderer: scenes, frames, masks, boxes, camera paths."""

import hashlib

import numpy as np
import pytest

from cmbench.miniworld import (
    CAMERA_STEP,
    CATEGORIES,
    FRAME,
    SOURCES,
    object_boxes,
    object_mask,
    pan,
    render_frame,
    render_video,
    sample_camera_path,
    sample_scene,
    scene_from_seed,
    shape_mask,
    visible_fraction,
    visible_pixels,
)
from cmbench.miniworld.appearance import BACKGROUND_PHOTOS, OBJECT_PHOTOS, load_photo


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


@pytest.fixture(scope="module", params=SOURCES)
def scene(request):
    return scene_from_seed(7, request.param)


def test_every_category_has_a_distinct_recognisable_silhouette():
    masks = {label: shape_mask(label, 12) for label in CATEGORIES}
    for label, mask in masks.items():
        assert mask.shape == (12, 12)
        assert 0.3 * 144 <= mask.sum() <= 0.75 * 144, label  # neither a speck nor a filled square
    digests = {_digest(m) for m in masks.values()}
    assert len(digests) == len(masks)


def test_bundled_photographs_load_offline():
    for name in [*OBJECT_PHOTOS, *BACKGROUND_PHOTOS]:
        photo = load_photo(name)
        assert photo.dtype == np.uint8 and photo.ndim == 3 and photo.shape[2] == 3
        assert min(photo.shape[:2]) >= 256 and photo.std() > 10


def test_same_seed_same_scene_other_seed_other_scene(scene):
    again = scene_from_seed(7, scene.source)
    assert _digest(again.panorama) == _digest(scene.panorama)
    assert _digest(again.labels) == _digest(scene.labels)
    assert [o.description for o in again.objects] == [o.description for o in scene.objects]
    assert _digest(scene_from_seed(8, scene.source).panorama) != _digest(scene.panorama)


def test_one_object_per_place_in_twins_of_different_appearance(scene):
    assert scene.panorama.shape == (FRAME, 256, 3) and len(scene.objects) == scene.n_places == 8
    for obj in scene.objects:
        assert obj.place == obj.object_id
        assert 10 <= obj.size <= 14
        assert obj.place * 32 <= obj.x and obj.x + obj.size <= obj.place * 32 + 32
        assert (scene.labels == obj.object_id).sum() == obj.area > 0
        twins = scene.twins(obj.object_id)
        assert len(twins) == 1
        twin = scene.objects[twins[0]]
        assert twin.category == obj.category and twin.appearance_key != obj.appearance_key
        if scene.source == "synthetic":  # no shared colour, no shared pattern
            assert not set(twin.appearance_key) & set(obj.appearance_key)


def test_frames_are_wrapping_crops_of_the_panorama():
    scene = scene_from_seed(3, "synthetic")
    for x in (0, 100, 240, 252):
        cols = (x + np.arange(FRAME)) % scene.width
        assert np.array_equal(render_frame(scene, x), scene.panorama[:, cols])
    cams = np.array([0, 4, 8, 252, 128])
    video = render_video(scene, cams)
    assert video.shape == (5, FRAME, FRAME, 3) and video.dtype == np.uint8
    for i, x in enumerate(cams):
        assert np.array_equal(video[i], render_frame(scene, int(x)))


def test_real_source_adds_per_frame_noise_and_exposure_drift():
    scene = scene_from_seed(3, "real")
    assert scene.noise_std >= 2 and scene.exposure_amplitude >= 0.04
    cams = np.full(64, 32)
    video = render_video(scene, cams).astype(np.float64)
    clean = scene.panorama[:, 32:64].astype(np.float64)
    assert not np.array_equal(video[0], video[1])  # fresh noise every frame
    gain = 1 + scene.exposure_amplitude * np.sin(2 * np.pi * np.arange(64) / scene.exposure_period + scene.exposure_phase)
    residual = video - gain[:, None, None, None] * clean
    assert abs(residual.std() - scene.noise_std) < 0.5
    assert abs(residual.mean()) < 0.3
    # the frame index, not the position in the call, seeds the noise
    tail = render_video(scene, cams[40:], first_frame=40)
    assert np.array_equal(tail, video[40:].astype(np.uint8))
    assert np.array_equal(render_frame(scene, 32, frame_index=41), tail[1])


def test_masks_boxes_and_visibility_agree(scene):
    obj = scene.objects[2]
    centred = scene.place_offset(2)
    for jitter in (-4, 0, 4):
        x = centred + jitter
        mask = object_mask(scene, x, 2)
        assert mask.sum() == obj.area  # whole object in view
        for other in (1, 3):  # neighbours' objects are fully out of view
            assert not object_mask(scene, x, other).any()
        box = object_boxes(scene, np.array([x]), 2)[0]
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        assert np.allclose(box * FRAME, [cols[0], rows[0], cols[-1] + 1, rows[-1] + 1])
        assert np.allclose((box[2] - box[0]) * FRAME, obj.size, atol=2)
    cams = np.arange(0, scene.width, CAMERA_STEP)
    pixels = visible_pixels(scene, cams)
    for i, x in enumerate(cams):
        assert [object_mask(scene, int(x), k).sum() for k in range(len(scene.objects))] == pixels[i].tolist()
    fraction = visible_fraction(scene, cams)
    assert fraction.max() == 1.0 and fraction.min() == 0.0
    assert np.isnan(object_boxes(scene, np.array([centred + 128]), 2)).all()


def test_pan_reaches_its_stop_in_whole_steps():
    assert pan(0, 32, 8, 1, 256).tolist() == [8, 16, 24, 32]
    assert pan(0, 36, 8, 1, 256).tolist() == [8, 16, 24, 32, 36]  # last step 4 px
    assert pan(8, 240, 4, -1, 256).tolist() == [4, 0, 252, 248, 244, 240]  # wraps around
    with pytest.raises(ValueError):
        pan(0, 32, 6, 1, 256)
    with pytest.raises(ValueError):
        pan(0, 30, 4, 1, 256)


def test_camera_paths_move_in_token_steps_with_dwells_and_revisits():
    rng = np.random.default_rng(0)
    path = sample_camera_path(rng, 2000, 256, revisit_gap=48)
    assert path.shape == (2000,) and path.dtype == np.int64
    assert (path % CAMERA_STEP == 0).all() and path.min() >= 0 and path.max() < 256
    step = np.abs(np.diff(path))
    step = np.minimum(step, 256 - step)
    assert set(step.tolist()) == {0, 4, 8}
    assert (step == 0).mean() > 0.15  # dwells
    # returns to an offset last held at least 48 frames earlier, after moving away from it
    last_seen: dict[int, int] = {}
    long_returns = 0
    for f, x in enumerate(path.tolist()):
        if x in last_seen and f - last_seen[x] >= 48 and path[f - 1] != x:
            long_returns += 1
        last_seen[x] = f
    assert long_returns >= 20
    assert np.array_equal(path, sample_camera_path(np.random.default_rng(0), 2000, 256, revisit_gap=48))


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="source"):
        sample_scene(np.random.default_rng(0), "cartoon")
    with pytest.raises(ValueError, match="width"):
        sample_scene(np.random.default_rng(0), "synthetic", width=250)
    scene = scene_from_seed(0)
    with pytest.raises(ValueError, match="integer"):
        render_video(scene, np.array([0.5, 4.0]))
    with pytest.raises(IndexError):
        object_mask(scene, 0, 99)


def _resize_spy(monkeypatch):
    """Record each cv2.resize call of the appearance module: (source shape, result)."""
    from cmbench.miniworld import appearance

    calls, real = [], appearance.cv2.resize
    monkeypatch.setattr(appearance.cv2, "resize", lambda src, *a, **k: calls.append((src.shape, real(src, *a, **k))) or calls[-1][1])
    return calls


@pytest.mark.parametrize("seed", range(6))
def test_a_photo_patch_is_cut_at_texture_scale_stretched_and_named_by_its_photo(seed, monkeypatch):
    from cmbench.miniworld.appearance import photo_appearance

    calls = _resize_spy(monkeypatch)
    look = photo_appearance(12, np.random.default_rng(seed))
    (name,) = look.key
    (crop, _), = calls
    # a square of at least 48 px and at most half the photo's short side: the photo's texture, not one pixel
    assert crop[0] == crop[1] and 48 <= crop[0] < min(load_photo(name).shape[:2]) // 2
    assert look.fill.shape == (12, 12, 3) and look.fill.dtype == np.uint8
    lo, hi = np.percentile(look.fill, (2, 98))
    assert lo <= 8 and hi >= 247  # contrast stretched to the full range
    assert look.description == f"{OBJECT_PHOTOS[name]} textured"


@pytest.mark.parametrize("seed", range(6))
def test_a_photo_background_keeps_the_bands_brightness_at_reduced_contrast_then_is_tinted(seed, monkeypatch):
    from cmbench.miniworld.appearance import BACKGROUND_TINTS, photo_background

    calls = _resize_spy(monkeypatch)
    background, description = photo_background(32, 128, np.random.default_rng(seed))
    (_, band), = calls
    name, tint = next((n, t) for n, words in BACKGROUND_PHOTOS.items() for t in BACKGROUND_TINTS
                      if description == f"{words} in {t} light")
    untinted = background.astype(np.float64) / np.asarray(BACKGROUND_TINTS[tint])
    source = band[:, :128].astype(np.float64)
    # brightness kept (to the seam's cross-fade and the uint8 rounding); contrast reduced to 0.6 (away from
    # the seam's first 32 columns, which the cross-fade averages with the band's end)
    assert abs(untinted.mean() - source.mean()) < 0.05 * source.mean()
    assert untinted[:, 32:].std() == pytest.approx(0.6 * source[:, 32:].std(), rel=0.03)
    assert background.shape == (32, 128, 3) and name in BACKGROUND_PHOTOS


@pytest.mark.parametrize("source", SOURCES)
def test_objects_keep_their_sizes_and_sit_near_the_middle_of_their_own_place(source):
    from cmbench.miniworld.scene import OBJECT_SIZES, PLACE_WIDTH

    sizes, shifts = set(), set()
    for seed in range(12):
        for obj in scene_from_seed(seed, source).objects:
            assert OBJECT_SIZES[0] <= obj.size <= OBJECT_SIZES[1]
            centred = obj.place * PLACE_WIDTH + (PLACE_WIDTH - obj.size) // 2
            assert -3 <= obj.x - centred <= 3  # a few pixels of jitter, never into the next place
            assert 1 <= obj.y <= FRAME - 1 - obj.size  # a pixel of background above and below
            sizes.add(obj.size)
            shifts.add(obj.x - centred)
    assert sizes == set(range(OBJECT_SIZES[0], OBJECT_SIZES[1] + 1)) and shifts == set(range(-3, 4))


@pytest.mark.parametrize("size", [10, 14])
def test_a_star_stands_on_two_legs_with_one_point_up(size):
    shape_mask.cache_clear()  # drawn here, not taken from the cache an earlier test filled
    mask = shape_mask("star", size)
    assert mask.shape == (size, size) and mask.dtype == bool
    rows = [np.flatnonzero(r) for r in mask if r.any()]
    top, bottom = rows[0], rows[-1]
    assert len(top) <= 2 and abs(top.mean() - (size - 1) / 2) < 0.5  # one point, centred
    runs = np.split(bottom, np.flatnonzero(np.diff(bottom) > 1) + 1)
    assert len(runs) == 2  # two legs
    assert np.array_equal(mask, mask[:, ::-1])  # symmetric about the vertical axis
