"""``python -m cmbench diagnose method=decoprune subset=miniworld_quick16``: the paper's motivating observation.

For every context chunk of the selected tasks' contexts and every denoising step: the error of the
``x0`` prediction against the clean chunk under the full cache, the method's cache and no history
(:mod:`cmbench.paper.diagnose`), split on MiniWorld by whether what the chunk shows was seen before
and is still cached, seen before but pruned, or new. Writes into ``out`` (default
``<out_dir>/<data>/diagnose/<label>``): ``diagnose.csv`` (one row per context, chunk, arm, step and
group), ``diagnose_summary.csv`` (mean per arm, group and step with 95% CIs clustered by context),
``diagnose.png`` (error vs step, one line per group, CI bands) and ``diagnose.md`` (whether DeCoPrune's
hypothesis holds here, with the paired comparisons). Selection as for ``run`` (``limit``, ``subset``,
``task_ids``: ``limit=N`` probes the contexts of a seeded sample of N tasks, each context once); data and
backbone swappable; ``method.target_pr=p`` diagnoses the method at the knob calibrated to PR ``p``. A line
per context says where it is, the time so far and the time left (:class:`ContextProgress`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cmbench.paper.diagnose import ARM_TITLES, Diagnosis, plot, run_diagnosis
from cmbench.calibration.target_pr import resolve_target_pr
from cmbench.runs import atomic
from cmbench.runs.output_folder import Legacy, claim
from cmbench.runs.progress import _duration as duration
from cmbench.identity.paths import path_component
from cmbench.spec import data_dir, resolve_run

FILES = ("diagnose.csv", "diagnose_summary.csv", "diagnose.png", "diagnose.md")
EARLIER = Legacy(required=(FILES,), names=FILES)
"""A diagnosis written before output folders were marked: its four files, nothing else."""


class ContextProgress:
    """The diagnosis's progress on stdout: a line as each context starts, with the time so far and the time
    left estimated from the contexts done (as ``run``'s progress lines), and a last line with the total.

    Parameters
    ----------
    clock : callable, optional
        Seconds (default :func:`time.monotonic`); tests pass their own.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or time.monotonic
        self.start = self.clock()

    def __call__(self, done: int, total: int, context_id: str) -> None:
        """Before context ``done + 1`` of ``total``."""
        elapsed = self.clock() - self.start
        left = f", ~{duration(elapsed / done * (total - done))} left" if done else ""
        print(f"[{done + 1}/{total}] {context_id}: {duration(elapsed)} elapsed{left}", flush=True)

    def finish(self, total: int) -> None:
        print(f"diagnosed {total} contexts in {duration(self.clock() - self.start)}", flush=True)


def markdown(found: Diagnosis, label: str, command: str) -> str:
    """The verdict page: what was measured, the verdict and its comparisons, the table at the probe step."""
    rows = found.rows
    at_probe = found.summary[found.summary["step"] == found.probe_step]
    lines = [f"# Denoising error with and without the relevant context: {label}", "",
             f"Command: `{command}`", "",
             f"{rows['context_id'].nunique()} contexts, {rows[['context_id', 'chunk']].drop_duplicates().shape[0]} "
             f"context chunks; probe step {found.probe_step}.", "",
             f"**DeCoPrune's hypothesis (lower error where the method's cache holds what the chunk shows): "
             f"{found.verdict}.**", ""]
    if found.note:
        lines += [f"Note: {found.note}.", ""]
    for c in found.comparisons:
        lines.append(f"- method's cache, step {found.probe_step}: {c.a} minus {c.b} = {c.difference:.4g} "
                     f"(95% CI +- {c.ci95:.3g}, paired over {c.contexts} contexts)")
    lines += ["", "| arm | group | error | 95% CI | chunks |", "|---|---|---|---|---|"]
    for r in at_probe.itertuples():
        lines.append(f"| {ARM_TITLES[str(r.arm)]} | {r.group} | {r.error:.4g} | +- {r.ci95:.3g} | {r.chunks} |")
    return "\n".join(lines) + "\n"


def execute(cfg: DictConfig) -> int:
    target = resolve_target_pr(cfg)  # method.target_pr -> the method's calibrated knob, as `run` does
    spec = resolve_run(target.cfg, target.record_fields())
    label = spec.identity.label
    out = Path(str(cfg.out)) if cfg.get("out") else data_dir(cfg) / "diagnose" / path_component(label, "label")
    folder = claim(out, "diagnose", "out", names=FILES, legacy=EARLIER)  # before the work: a folder of the user's is refused
    shown = ContextProgress()
    found = run_diagnosis(spec, on_context=shown)
    shown.finish(found.rows["context_id"].nunique())
    folder.add(*FILES)
    command = " ".join(["python -m cmbench diagnose", *(o for o in HydraConfig.get().overrides.task
                                                          if not o.startswith("hydra."))])
    atomic.write_with(out / FILES[0], lambda tmp: found.rows.to_csv(tmp, index=False, float_format="%.6g"))
    atomic.write_with(out / FILES[1], lambda tmp: found.summary.to_csv(tmp, index=False, float_format="%.6g"))
    atomic.write_with(out / FILES[2], lambda tmp: plot(found.summary, tmp, f"{label}: x0 error vs denoising step "
                                                         f"({found.rows['context_id'].nunique()} contexts, 95% CI)"))
    page = markdown(found, label, command)
    atomic.write_with(out / FILES[3], lambda tmp: tmp.write_text(page))
    print(page, end="")
    print(f"wrote {', '.join(FILES)} to {out}")
    return 0
