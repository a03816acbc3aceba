"""MiniWorld: a procedural wrap-around world with a camera, and a CMBench-shaped suite built from it.

Rendering API (pure functions, numpy, deterministic from a ``numpy.random.Generator``)::

    scene = sample_scene(rng, source="synthetic", width=256)      # or scene_from_seed(seed, ...)
    cams = sample_camera_path(rng, n_frames=32, width=scene.width)  # int64 [F], multiples of 4
    frames = render_video(scene, cams, first_frame=0)             # uint8 [F, 32, 32, 3]
    frame = render_frame(scene, cams[0], frame_index=0)           # uint8 [32, 32, 3]
    mask = object_mask(scene, cams[0], object_id)                 # bool [32, 32]

Suite: ``build_suite(cfg.data)`` writes the official layout; ``load_context(task)`` and
``load_ground_truth(task)`` read a task's lossless context and true continuation.

See docs/miniworld.md for the world, the episodes and the suite layout.
"""

from cmbench.miniworld.camera import SPEEDS, pan, sample_camera_path
from cmbench.miniworld.readers import MiniWorldDataError, load_context, load_ground_truth
from cmbench.miniworld.render import (
    object_boxes,
    object_mask,
    object_masks,
    render_frame,
    render_video,
    visible_fraction,
    visible_pixels,
)
from cmbench.miniworld.scene import CAMERA_STEP, FRAME, PLACE_WIDTH, SOURCES, Scene, SceneObject, sample_scene, scene_from_seed
from cmbench.miniworld.shapes import CATEGORIES, Category, shape_mask
from cmbench.miniworld.suite import SuiteConfig, build_suite

__all__ = [
    "CAMERA_STEP",
    "CATEGORIES",
    "Category",
    "FRAME",
    "MiniWorldDataError",
    "PLACE_WIDTH",
    "SOURCES",
    "SPEEDS",
    "Scene",
    "SceneObject",
    "object_boxes",
    "object_mask",
    "object_masks",
    "pan",
    "render_frame",
    "render_video",
    "sample_camera_path",
    "SuiteConfig",
    "build_suite",
    "load_context",
    "load_ground_truth",
    "sample_scene",
    "scene_from_seed",
    "shape_mask",
    "visible_fraction",
    "visible_pixels",
]
