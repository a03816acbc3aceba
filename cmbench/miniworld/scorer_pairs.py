"""Validation of a scorer on MiniWorld ground truth: same entity vs same-category distractor.

Each MiniWorld object has a twin: same category (same silhouette and text label), clearly different
appearance. For every object we render a reference frame (object fully in view, annotated with its
ground-truth box) and two test frames from other camera offsets and other frame indices (so the
``real`` source's sensor noise and exposure differ): one showing the object itself (a positive pair)
and one showing its twin (a negative pair). A scorer scores a test frame against the reference with
the task protocol (detect, segment, embed, cosine; 0 when nothing is detected); ROC AUC measures how
well these scores separate positives from negatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from cmbench.data.task import Box, as_box
from cmbench.miniworld import object_boxes, object_mask, render_frame, scene_from_seed, visible_fraction
from cmbench.miniworld.scene import Scene
from cmbench.scoring.boxes import masked_crop
from cmbench.scoring.pipeline import Scorer, frame_similarities

# camera offsets tried around a place's centre (multiples of the 4-px camera step)
JITTER = (-8, -4, 0, 4, 8)


@dataclass(frozen=True)
class Pair:
    """A reference view and a test frame showing the same object or its twin.

    Attributes
    ----------
    source : {"synthetic", "real"}
    same : bool
        True when the test frame shows the reference object, False when it shows its twin.
    category : str
        Target label (text query).
    reference_frame : ndarray, ``uint8 [32, 32, 3]``
    reference_box : tuple of 4 float
        Ground-truth normalised box of the object in the reference frame.
    reference_mask : ndarray, ``bool [32, 32]``
        Ground-truth mask of the object in the reference frame.
    frame : ndarray, ``uint8 [32, 32, 3]``
        The test frame.
    frame_mask : ndarray, ``bool [32, 32]``
        Ground-truth mask of the object the test frame shows.
    """

    source: str
    same: bool
    category: str
    reference_frame: np.ndarray
    reference_box: Box
    reference_mask: np.ndarray
    frame: np.ndarray
    frame_mask: np.ndarray


def _full_view_offsets(scene: Scene, object_id: int) -> list[int]:
    """Camera offsets near the object's place that show all of it."""
    centre = scene.place_offset(scene.objects[object_id].place)
    offsets = [(centre + j) % scene.width for j in JITTER]
    full = visible_fraction(scene, np.array(offsets, dtype=np.int64))[:, object_id] >= 1.0
    return [o for o, ok in zip(offsets, full) if ok]


def build_pairs(
    n_scenes: int, seed: int = 0, sources: Sequence[str] = ("synthetic", "real"), width: int = 256,
    dynamic: bool = True,
) -> list[Pair]:
    """One positive and one negative pair per object that has a twin.

    Parameters
    ----------
    n_scenes : int
        Scenes per source.
    seed : int
        Seeds scene choice, camera offsets and frame indices.
    sources : sequence of str
    width : int
        Panorama width (256: 8 places, every object has exactly one twin).
    dynamic : bool
        Dynamic scenes (the default world: movers, schedule, lighting), so the reference and the test
        frame, taken at random frame indices, differ in light and movers too; False: the static world.

    Returns
    -------
    list of Pair (positives and negatives interleaved)
    """
    rng = np.random.default_rng(seed)
    pairs = []
    for source in sources:
        for _ in range(n_scenes):
            scene = scene_from_seed(int(rng.integers(2**31)), source, width, dynamic)
            for obj in scene.objects:
                twins = scene.twins(obj.object_id)
                if not twins:
                    continue
                ref_cam = int(rng.choice(_full_view_offsets(scene, obj.object_id)))
                ref_index = int(rng.integers(0, 4096))
                ref_frame = render_frame(scene, ref_cam, ref_index)
                ref_box = as_box(object_boxes(scene, np.array([ref_cam]), obj.object_id)[0])
                ref_mask = object_mask(scene, ref_cam, obj.object_id)
                for shown, same in ((obj.object_id, True), (int(rng.choice(twins)), False)):
                    cam = int(rng.choice(_full_view_offsets(scene, shown)))
                    index = int(rng.integers(0, 4096))
                    pairs.append(
                        Pair(
                            source=source,
                            same=same,
                            category=obj.category,
                            reference_frame=ref_frame,
                            reference_box=ref_box,
                            reference_mask=ref_mask,
                            frame=render_frame(scene, cam, index),
                            frame_mask=object_mask(scene, cam, shown),
                        )
                    )
    return pairs


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U; ties count one half).

    Parameters
    ----------
    scores : ndarray, ``float [N]``
    labels : ndarray, ``bool [N]``
        True for positives; both classes must be present.
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc needs both positives and negatives")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def pipeline_scores(scorer: Scorer, pairs: Sequence[Pair]) -> tuple[np.ndarray, np.ndarray]:
    """Task-protocol score of each pair's test frame against its reference.

    Returns
    -------
    scores : ndarray, ``float64 [N]`` (0 where the target is not detected)
    detected : ndarray, ``bool [N]``
    """
    scores = np.zeros(len(pairs))
    detected = np.zeros(len(pairs), dtype=bool)
    for i, pair in enumerate(pairs):
        features = scorer.features(pair.frame[None], (pair.category,), [pair.reference_frame], [pair.reference_box])
        detected[i] = bool(features.detected[0])
        scores[i] = float(frame_similarities(features)[0]) if detected[i] else 0.0
    return scores, detected


def descriptor_scores(scorer: Scorer, pairs: Sequence[Pair]) -> np.ndarray:
    """Cosine of the embedder alone on ground-truth masked crops (no detection, no segmentation),
    ``float64 [N]``: isolates the descriptor's own power to tell an entity from its twin."""
    crops = []
    for pair in pairs:
        crops += [masked_crop(pair.reference_frame, pair.reference_mask), masked_crop(pair.frame, pair.frame_mask)]
    emb = scorer.embedder.embed([c for c, _ in crops], [m for _, m in crops]).astype(np.float64)
    return np.einsum("nd,nd->n", emb[0::2], emb[1::2])
