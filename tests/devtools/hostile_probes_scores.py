"""The hostile pass's probes on submitted continuations that could game the score, and received values that must be refused with one line.

Each probe attacks the real command line (see :mod:`devtools.hostile`); the shared inputs (a small
suite, one real run folder) come from :mod:`devtools.hostile_probes`.
"""

from __future__ import annotations

from devtools.hostile import Probe

PROBES: list[Probe] = []
