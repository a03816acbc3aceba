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
