"""What every config key is for: the one declaration that says which keys decide a result.

Three places need to sort keys: a run's identity hashes the root keys that change a record and leaves
out those that only select tasks or place outputs; a scorer's identity hashes the keys that change its
numbers and leaves out device, batch size and cache; a backbone's loader receives every key except
those CMBench itself reads. Each of these lists is derived here from one table per config level, and a
test checks that every key of the shipped configs is declared, so a new key cannot silently land on
the wrong side.

Roles:

``identity``
    Changes a number in a record: part of the run's (or scorer's) identity.
``selection``
    Chooses which tasks run, where outputs go or how they are shown (the ``label`` too: a display
    name); never a number.
``runtime``
    Where and how fast a component runs (device, batch size, cache folder), not what it computes.
``doc``
    Documentation (name, description, paper).
``cmbench``
    (backbone configs) read by CMBench itself, not passed to the backbone's loader.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["identity", "selection", "runtime", "doc", "cmbench"]

ROOT_KEYS: dict[str, Role] = {
    "data": "identity",
    "method": "identity",
    "backbone": "identity",
    "scorer": "identity",
    "generation": "identity",
    "storage": "identity",
    "cache": "identity",
    "seed": "identity",
    "label": "selection",
    "limit": "selection",
    "sample_seed": "selection",
    "task_ids": "selection",
    "subset": "selection",
    "shard": "selection",
    "progress": "selection",
    "progress_every": "selection",
    "progress_seconds": "selection",
    "logging": "selection",
    "keep_other_code": "selection",
    "out_dir": "selection",
    "leaderboard": "selection",
    "report": "selection",
    "runs": "selection",
    "save_videos": "selection",
    "lossless_max_pixels": "selection",
    "score_source": "identity",
    "videos": "selection",
    "out": "selection",
    "experiment": "selection",
    "threads": "selection",
    "parallel": "selection",
    "check": "selection",
    "target_pr": "selection",
    "target_bytes": "selection",
    "methods": "selection",
    "target_prs": "selection",
    "calibration": "selection",
}
"""Top-level keys of ``configs/config.yaml`` (``hydra`` is Hydra's own and never part of a result)."""

SCORER_KEYS: dict[str, Role] = {
    "name": "doc",
    "description": "doc",
    "paper": "doc",
    "device": "runtime",
    "precision": "runtime",
    "batch_size": "runtime",
    "cache_dir": "runtime",
    "min_box_size": "identity",
    "reference_aggregation": "identity",
    "detector": "identity",
    "segmenter": "identity",
    "embedder": "identity",
    "quality": "identity",
    "quality_settings": "identity",
}
"""Keys of a ``configs/scorer/*.yaml`` (the effective precision, fp32 on a CPU, is hashed by the scorer)."""

REFERENCE_AGGREGATIONS = ("mean", "max")
CACHE_DTYPES = ("bfloat16", "float16", "float32")
"""Values of ``cache.dtype`` (besides ``null``, the model's own): the precision the KV cache stores its rows in."""
SCORE_SOURCES = ("frames", "mp4")  # what a run scores: the decoded frames, or their saved mp4 (the authors')
"""Values of ``scorer.reference_aggregation``: how a task's score combines its references' best scores."""

BACKBONE_KEYS: dict[str, Role] = {
    "name": "doc",
    "description": "doc",
    "paper": "doc",
    "_target_": "cmbench",
    "context": "cmbench",
    "head_map": "cmbench",
    "sampler": "cmbench",
    "memory": "runtime",
}
"""Keys of a ``configs/backbone/*.yaml`` that CMBench reads; every other key is a loader argument.

``_target_`` is the loader to call; ``context`` how context videos are prepared for the backbone;
``head_map`` its calibrated static / dynamic head map (the default of head-split methods); ``sampler``
its own schedule (the default of ``generation.timesteps`` / ``generation.stochastic``); ``memory`` the
memory plan's settings (:mod:`cmbench.backbones.memory`): where caches live changes no number (the
GPU check asserts host-resident output equals resident output), so it is runtime, not identity.
"""


def keys_with_role(schema: dict[str, Role], *roles: Role) -> tuple[str, ...]:
    """The keys of ``schema`` whose role is one of ``roles``, in declaration order."""
    return tuple(key for key, role in schema.items() if role in roles)
