"""The hostile pass's probes on unbounded reads: FIFOs, devices, sparse and decompression-bomb files in received folders.

Each probe attacks the real command line (see :mod:`devtools.hostile`); the shared inputs (a small
suite, one real run folder) come from :mod:`devtools.hostile_probes`.
"""

from __future__ import annotations

from devtools.hostile import Probe

PROBES: list[Probe] = []
