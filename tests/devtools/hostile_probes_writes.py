"""The hostile pass's probes on outputs pointed at a folder CMBench did not write, and received files that are links.

Each probe attacks the real command line (see :mod:`devtools.hostile`); the shared inputs (a small
suite, one real run folder) come from :mod:`devtools.hostile_probes`.
"""

from __future__ import annotations

from devtools.hostile import Probe

PROBES: list[Probe] = []
