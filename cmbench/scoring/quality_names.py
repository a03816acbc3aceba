"""The quality metrics' names: the record field of each, as VBench names it, and its column header.

Kept apart from the metrics themselves so records, the scorer registry and the reports share one list.
"""

QUALITY_FIELDS = ("subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
                  "aesthetic_quality", "imaging_quality", "subject_consistency_light", "background_consistency_light")
"""The quality metrics' record fields, named as VBench names them (``*_light``: CPU stand-ins with VBench's
formula on light features, not VBench's numbers)."""

QUALITY_LABELS = {
    "subject_consistency": "Subject Consistency", "background_consistency": "Background Consistency",
    "temporal_flickering": "Temporal Flickering", "motion_smoothness": "Motion Smoothness",
    "aesthetic_quality": "Aesthetic Quality", "imaging_quality": "Imaging Quality",
    "subject_consistency_light": "Subject Consistency (light)",
    "background_consistency_light": "Background Consistency (light)",
}
"""The quality columns' headers, as VBench names its dimensions."""

BOUNDED_QUALITY = ("subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
                   "subject_consistency_light", "background_consistency_light")
"""The metrics in [0, 1] by their formula."""

TEMPORAL_QUALITY = ("subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
                    "subject_consistency_light", "background_consistency_light")
"""The metrics that compare frames with each other. On a continuation with fewer than 2 frames, or whose
frames are all identical (a still or black video), they are undefined, not perfect: VBench's formulas give
such a video 1.0, which would reward a continuation that froze."""

UNDEFINED = "undefined: "
"""How the reason recorded for an undefined metric (``quality_absent``) begins."""


def is_undefined(reason: object) -> bool:
    """Whether a recorded ``quality_absent`` reason says the metric is undefined on that video (a still,
    black or one-frame continuation), rather than unavailable on the machine."""
    return isinstance(reason, str) and reason.startswith(UNDEFINED)
