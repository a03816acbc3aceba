"""Task records, the official manifest loader with strict validation, and video I/O."""

from cmbench.data.manifest import (
    ManifestError,
    Problem,
    load_manifest,
    validate_manifest,
)
from cmbench.data.task import SOURCES, TASK_TYPES, Reference, Task
from cmbench.data.video import VideoError, prepare_context, read_video, write_video

__all__ = [
    "ManifestError",
    "Problem",
    "Reference",
    "SOURCES",
    "TASK_TYPES",
    "Task",
    "VideoError",
    "load_manifest",
    "prepare_context",
    "read_video",
    "validate_manifest",
    "write_video",
]
