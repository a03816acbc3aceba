"""Scorer backends by name, and :func:`build_scorer` from a ``configs/scorer/*.yaml`` mapping.

A scorer config has top-level runtime knobs and one mapping per stage, each naming its ``backend``
and that backend's keyword arguments::

    name: owl_sam_dino
    device: auto          # auto | cpu | cuda[:N]
    precision: bf16       # fp32 | fp16 | bf16 autocast, on CUDA only (a CPU runs fp32)
    batch_size: 8
    cache_dir: .cache/score_cache   # null disables the feature cache
    min_box_size: 1.0
    reference_aggregation: mean     # mean | max of the references' best similarities
    detector:  {backend: owlvit, model: google/owlvit-base-patch32, score_threshold: 0.1}
    segmenter: {backend: sam2, model: facebook/sam2.1-hiera-large}
    embedder:  {backend: dinov2, model: facebook/dinov2-base, crop_mode: processor}
    quality: vbench       # a preset (QUALITY_PRESETS) or a list of quality metrics
    quality_settings:     # per metric, its arguments
      subject_consistency: {model: facebook/dino-vitb16}

Quality metrics (:mod:`cmbench.scoring.quality`) are registered in :data:`QUALITY_METRICS`; their
config is hashed apart (:func:`quality_hash`), so choosing other quality metrics keeps the memory
score's identity and feature cache.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from cmbench.config_schema import SCORER_KEYS, keys_with_role
from cmbench.hashing import config_hash
from cmbench.registry import Registry, did_you_mean
from cmbench.scoring.appearance import AppearanceEmbedder
from cmbench.scoring.dino import Dinov2Embedder
from cmbench.scoring.errors import ScorerConfigError
from cmbench.scoring.grabcut_segmenter import GrabCutSegmenter
from cmbench.scoring.owl import Owlv2Detector, OwlVitDetector
from cmbench.scoring.quality_names import QUALITY_FIELDS
from cmbench.scoring.pipeline import Scorer
from cmbench.scoring.quality import QualityScorer, QualityUnavailable, TemporalFlickering
from cmbench.scoring.quality_light import BackgroundConsistencyLight, SubjectConsistencyLight
from cmbench.scoring.quality_models import (
    AestheticQuality,
    BackgroundConsistency,
    ImagingQuality,
    MotionSmoothness,
    SubjectConsistency,
)
from cmbench.scoring.runtime import Runtime, resolve_runtime
from cmbench.scoring.sam2_hf import Sam2Segmenter
from cmbench.scoring.sam2_official import OfficialSam2Segmenter
from cmbench.scoring.template_detector import TemplateDetector

STAGES: dict[str, Registry[type]] = {
    kind: Registry(f"{kind} backend", entry_point_group=f"cmbench.{kind}s") for kind in ("detector", "segmenter", "embedder")
}
for _kind, _backends in (
    ("detector", {"owlvit": OwlVitDetector, "owlv2": Owlv2Detector, "template": TemplateDetector}),
    ("segmenter", {"sam2": Sam2Segmenter, "sam2_official": OfficialSam2Segmenter, "grabcut": GrabCutSegmenter}),
    ("embedder", {"dinov2": Dinov2Embedder, "appearance": AppearanceEmbedder}),
):
    for _name, _cls in _backends.items():
        STAGES[_kind].add(_name, _cls)

QUALITY_METRICS: Registry[type] = Registry("quality metric", entry_point_group="cmbench.quality_metrics")
for _cls in (TemporalFlickering, SubjectConsistency, BackgroundConsistency, AestheticQuality, ImagingQuality,
             MotionSmoothness, SubjectConsistencyLight, BackgroundConsistencyLight):
    QUALITY_METRICS.add(_cls.name, _cls)

QUALITY_PRESETS: dict[str, tuple[str, ...]] = {
    # the paper's Table 1 columns (VBench's names and models)
    "vbench": ("subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
               "aesthetic_quality", "imaging_quality"),
    # CPU, no weights: flickering exactly, the consistencies on light features
    "miniworld": ("temporal_flickering", "subject_consistency_light", "background_consistency_light"),
    "none": (),
}
"""Named quality sets for ``scorer.quality``."""

# Top-level keys (cmbench.config_schema): RUNTIME_KEYS do not change a number and stay out of the hash;
# QUALITY_KEYS change the quality columns only and are hashed apart (quality_hash).
QUALITY_KEYS = ("quality", "quality_settings")
RUNTIME_KEYS = keys_with_role(SCORER_KEYS, "doc", "runtime")
RESULT_KEYS = tuple(k for k in keys_with_role(SCORER_KEYS, "identity") if k not in QUALITY_KEYS)

# Bump when a change of the scoring code changes numbers: it invalidates every cached feature.
# 2: preprocessing on the device with the processors' arithmetic (SAM 2 antialiased, DINOv2 crop
#    modes), per-reference scores and their aggregation.
SCORER_VERSION = 2
# Bump when a change of the quality metrics' code changes their numbers.
# 2: frame-comparing metrics undefined on a still, black or one-frame continuation (were 1.0).
QUALITY_VERSION = 2


def build_stage(kind: str, cfg: Mapping[str, Any], runtime: Runtime):
    """Instantiate one stage.

    Parameters
    ----------
    kind : {"detector", "segmenter", "embedder"}
    cfg : mapping
        ``backend`` plus the backend's keyword arguments.
    runtime : Runtime
        Passed to backends whose constructor takes ``runtime``.
    """
    cfg = dict(cfg)
    registry = STAGES[kind]
    backend = cfg.pop("backend", None)
    if backend not in registry:
        hint = did_you_mean(str(backend), registry.names()) if backend else ""
        raise ScorerConfigError(
            f"scorer.{kind}.backend={backend!r} is not a {kind} backend; choose one of {', '.join(registry.names())}.{hint}"
        )
    cls = registry.get(backend)
    params = inspect.signature(cls).parameters  # the constructor's, without self
    accepted = [p for p in params if p not in ("self", "runtime")]
    unknown = [k for k in cfg if k not in accepted]
    if unknown:
        raise ScorerConfigError(
            f"scorer.{kind} ({backend}) does not take {', '.join(unknown)}; it takes {', '.join(accepted)}."
            + did_you_mean(unknown[0], accepted)
        )
    missing = [p for p in accepted if params[p].default is inspect.Parameter.empty and p not in cfg]
    if missing:
        raise ScorerConfigError(f"scorer.{kind} ({backend}) needs {', '.join(missing)}")
    if "runtime" in params:
        cfg["runtime"] = runtime
    try:
        return cls(**cfg)
    except (TypeError, ValueError) as err:
        raise ScorerConfigError(f"scorer.{kind} ({backend}): {err}") from err


def result_config(cfg: Mapping[str, Any], runtime: Runtime) -> dict[str, Any]:
    """The part of a scorer config that changes numbers (what :func:`scorer_hash` hashes)."""
    out = {key: _plain(cfg[key]) for key in RESULT_KEYS if key in cfg}
    out["precision"] = runtime.precision
    out["reference_aggregation"] = str(cfg.get("reference_aggregation", "mean"))
    return out


def scorer_hash(result_config: Mapping[str, Any]) -> str:
    """Identity of a scorer: the knobs that change its numbers plus :data:`SCORER_VERSION`.

    Returns
    -------
    str
        12 hex digits, written into every record and used as the feature-cache folder.
    """
    return config_hash({"scorer_version": SCORER_VERSION, "config": dict(result_config)}, digits=12)


def _plain(value: Any) -> Any:
    """DictConfig / ListConfig / tuples -> plain dicts and lists (resolved)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def quality_selection(cfg: Mapping[str, Any]) -> list[str]:
    """The metric names ``scorer.quality`` selects: a preset name, a list of metric names, or null
    (none).

    Raises
    ------
    ScorerConfigError
        An unknown preset or metric (with a "did you mean"), or a metric named twice.
    """
    value = _plain(cfg.get("quality"))
    if value is None:
        return []
    if isinstance(value, str):
        if value not in QUALITY_PRESETS:
            raise ScorerConfigError(
                f"scorer.quality={value!r} is not a quality preset; choose one of {', '.join(QUALITY_PRESETS)} "
                f"or a list of metrics.{did_you_mean(value, [*QUALITY_PRESETS, *QUALITY_METRICS.names()])}")
        return list(QUALITY_PRESETS[value])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ScorerConfigError(f"scorer.quality={value!r}: expected a preset name or a list of metric names")
    for name in value:
        if name not in QUALITY_METRICS:
            raise ScorerConfigError(
                f"scorer.quality: {name!r} is not a quality metric; choose from {', '.join(QUALITY_METRICS.names())}."
                + did_you_mean(name, QUALITY_METRICS.names()))
    doubled = sorted({n for n in value if value.count(n) > 1})
    if doubled:
        raise ScorerConfigError(f"scorer.quality names {', '.join(doubled)} more than once")
    return list(value)


def quality_config(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``metric -> its arguments`` for the selected metrics (``scorer.quality_settings``; metrics it
    does not mention take their defaults). Settings of metrics not selected are checked for their
    names, not used."""
    names = quality_selection(cfg)
    settings = _plain(cfg.get("quality_settings")) or {}
    if not isinstance(settings, dict):
        raise ScorerConfigError(f"scorer.quality_settings={settings!r}: expected a mapping metric -> arguments")
    for name, args in settings.items():
        if name not in QUALITY_METRICS:
            raise ScorerConfigError(f"scorer.quality_settings.{name}: not a quality metric."
                                    + did_you_mean(name, QUALITY_METRICS.names()))
        if args is not None and not isinstance(args, dict):
            raise ScorerConfigError(f"scorer.quality_settings.{name}={args!r}: expected a mapping of arguments")
    return {name: dict(settings.get(name) or {}) for name in names}


def quality_hash(config: Mapping[str, Mapping[str, Any]]) -> str:
    """Identity of the quality metrics: the selected metrics, their arguments and :data:`QUALITY_VERSION`
    (12 hex digits; ``quality_hash`` in records)."""
    return config_hash({"quality_version": QUALITY_VERSION, "metrics": {k: dict(v) for k, v in config.items()}},
                       digits=12)


def build_quality(cfg: Mapping[str, Any], runtime: Runtime) -> QualityScorer | None:
    """The :class:`QualityScorer` of a scorer config (None when it selects no metric).

    A metric whose optional package, code or weights are not here (it raises
    :class:`QualityUnavailable`) is absent with that reason in every record; a wrong argument is a
    :class:`ScorerConfigError`.
    """
    config = quality_config(cfg)
    if not config:
        return None
    metrics, unavailable = [], {}
    for name, args in config.items():
        cls = QUALITY_METRICS.get(name)
        if name not in QUALITY_FIELDS:
            raise ScorerConfigError(f"quality metric {name!r} has no record field (known: {', '.join(QUALITY_FIELDS)})")
        params = inspect.signature(cls).parameters
        accepted = [p for p in params if p not in ("self", "runtime")]
        unknown = [k for k in args if k not in accepted]
        if unknown:
            raise ScorerConfigError(
                f"scorer.quality_settings.{name} does not take {', '.join(unknown)}; it takes "
                f"{', '.join(accepted) or 'nothing'}." + did_you_mean(unknown[0], accepted))
        kwargs = {**args, **({"runtime": runtime} if "runtime" in params else {})}
        try:
            metrics.append(cls(**kwargs))
        except QualityUnavailable as err:
            unavailable[name] = str(err)
        except (TypeError, ValueError) as err:
            raise ScorerConfigError(f"scorer.quality_settings.{name}: {err}") from err
    return QualityScorer(metrics, unavailable, quality_hash(config))


def build_scorer(cfg: Mapping[str, Any], cache_dir: str | None = None, runtime: Runtime | None = None) -> Scorer:
    """Build a :class:`Scorer` from a scorer config (``cfg.scorer`` of the Hydra root config).

    Parameters
    ----------
    cfg : mapping (dict or DictConfig)
    cache_dir : str, optional
        Overrides ``cfg.cache_dir``.
    runtime : Runtime, optional
        Overrides ``device`` / ``precision`` / ``batch_size`` as given, without the config rule that a
        CPU runs fp32 (checks use it to run bf16 autocast on a CPU).
    """
    cfg = _plain(cfg)
    known = RUNTIME_KEYS + RESULT_KEYS + QUALITY_KEYS
    unknown = [k for k in cfg if k not in known]
    if unknown:
        raise ScorerConfigError(
            f"unknown scorer config key(s) {', '.join(unknown)}; known: {', '.join(known)}." + did_you_mean(unknown[0], known)
        )
    missing = [k for k in STAGES if k not in cfg]
    if missing:
        raise ScorerConfigError(f"scorer config {cfg.get('name', '?')!r} lacks the stage(s) {', '.join(missing)}")
    if runtime is None:
        runtime = resolve_runtime(cfg.get("device", "auto"), str(cfg.get("precision", "fp32")), cfg.get("batch_size", 8))
    stages = {kind: build_stage(kind, cfg[kind], runtime) for kind in STAGES}
    digest = scorer_hash(result_config(cfg, runtime))
    root = cache_dir if cache_dir is not None else cfg.get("cache_dir")
    try:
        return Scorer(
            **stages,
            name=str(cfg.get("name", "scorer")),
            config_hash=digest,
            cache_dir=root or None,
            min_box_size=float(cfg.get("min_box_size", 1.0)),
            reference_aggregation=str(cfg.get("reference_aggregation", "mean")),
            batch_size=runtime.batch_size,
            quality=build_quality(cfg, runtime),
        )
    except ValueError as err:
        raise ScorerConfigError(f"scorer: {err}") from err
