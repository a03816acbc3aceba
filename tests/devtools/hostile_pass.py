"""Every probe of the hostile pass, in the order they run: the first pass's probes, then one module per
class of attack (outputs and links, bounded reads, scores and received values, received data that
must never steer code or outrank a model)."""

from __future__ import annotations

from devtools import (hostile_probes, hostile_probes_reads, hostile_probes_received, hostile_probes_scores,
                      hostile_probes_writes)
from devtools.hostile_probes import new_workspace

PROBES = [*hostile_probes.PROBES, *hostile_probes_writes.PROBES, *hostile_probes_reads.PROBES,
          *hostile_probes_scores.PROBES, *hostile_probes_received.PROBES]

__all__ = ["PROBES", "new_workspace"]
