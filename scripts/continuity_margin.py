"""The continuity rule's margin: CMBench's own continuations against copies of the context.

    python scripts/continuity_margin.py RUN_DIR [RUN_DIR ...] --out results/continuity_margin.md

For every run folder given (``run`` output with its saved ``videos/``), the continuity error of each saved
continuation (:mod:`cmbench.scoring.continuity`), computed from the lossless video and the task's camera
plan; then, on every task of the first run's manifest, the same error of five attacks a submitter could
make from the context alone: the reference frame sixteen times (with +-3 noise, and exact), the context's
first sixteen frames replayed at 64x64, its last sixteen frames, and its last frame sixteen times. Writes
the distribution of each (min, median, 95th percentile, max) against the threshold, and the margins.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cmbench.data import load_manifest  # noqa: E402
from cmbench.data.video import VideoReader  # noqa: E402
from cmbench.miniworld.readers import camera_plan, extension, load_context  # noqa: E402
from cmbench.report.reading import folder_manifest, read_records  # noqa: E402
from cmbench.scoring.continuity import CONTINUITY_THRESHOLD, continuity_fields  # noqa: E402


def attacks(seed: int = 0) -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """Continuations made from a task's context frames ``uint8 [F, 32, 32, 3]`` and its reference frame."""
    rng = np.random.default_rng(seed)
    return {
        "reference frame x16, +-3 noise": lambda c, r: np.clip(
            r[None].astype(int) + rng.integers(-3, 4, (16, *r.shape)), 0, 255).astype(np.uint8),
        "reference frame x16": lambda c, r: np.repeat(r[None], 16, axis=0),
        "context's first 16 frames at 64x64": lambda c, r: np.stack([cv2.resize(f, (64, 64)) for f in c[:16]]),
        "context's last 16 frames": lambda c, r: c[-16:],
        "context's last frame x16": lambda c, r: np.repeat(c[-1:], 16, axis=0),
    }


def run_errors(run: Path) -> tuple[str, list[float]]:
    """The run's label and the continuity error of each saved continuation with a camera plan."""
    manifest = folder_manifest(run)
    if manifest is None:
        raise SystemExit(f"{run}: its config names no manifest")
    tasks = {t.task_id: t for t in load_manifest(manifest.parent, manifest.name)}
    records = read_records(run)
    errors = []
    for row in records.frame.itertuples():
        if row.status != "ok" or not isinstance(row.video, str):
            continue
        task = tasks[row.task_id]
        got = continuity_fields(camera_plan(task), lambda task=task: load_context(task)[0], VideoReader(run / row.video))
        if got["continuity"] is not None:
            errors.append(got["continuity"])
    return records.label, errors


def attack_errors(manifest: Path) -> dict[str, list[float]]:
    """Each attack's continuity error on every task of ``manifest``."""
    out: dict[str, list[float]] = {name: [] for name in attacks()}
    made = attacks()
    for task in load_manifest(manifest.parent, manifest.name):
        context, _ = load_context(task)
        reference = context[task.references[0].frame_at(float(extension(task).get("fps", 16)), native=True)]
        for name, make in made.items():
            got = continuity_fields(camera_plan(task), lambda context=context: context, make(context, reference))
            if got["continuity"] is not None:
                out[name].append(got["continuity"])
    return out


def row(name: str, values: list[float]) -> str:
    a = np.asarray(values)
    return (f"| {name} | {len(a)} | {a.min():.4f} | {np.median(a):.4f} | {np.percentile(a, 95):.4f} | "
            f"{a.max():.4f} | {int((a > CONTINUITY_THRESHOLD).sum())} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with their saved videos")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here too")
    parser.add_argument("--how", default="", help="how the runs were made (a line of the page)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    own = dict(run_errors(run) for run in args.runs)
    manifest = folder_manifest(args.runs[0])
    assert manifest is not None  # run_errors refused a run without one
    copies = attack_errors(manifest)
    highest, lowest = max(max(v) for v in own.values()), min(min(v) for v in copies.values() if v)
    lines = ["| continuations | n | min | median | 95th pct | max | over the threshold |", "|---|---|---|---|---|---|---|",
             *(row(name, values) for name, values in own.items()),
             *(row(f"attack: {name}", values) for name, values in copies.items())]
    text = (f"# Continuity: CMBench's own continuations against copies of the context\n\n```\n"
            f"python scripts/continuity_margin.py {' '.join(str(r) for r in args.runs)}\n```\n\n"
            + (f"{args.how}\n\n" if args.how else "") +
            f"Continuity error (docs/scoring.md#continuity) of every saved continuation of the runs above, then of "
            f"five attacks built from the context of each task of `{manifest}`. Threshold: "
            f"**{CONTINUITY_THRESHOLD}**. CMBench's own runs reach at most {highest:.4f} (margin "
            f"{CONTINUITY_THRESHOLD - highest:.4f} under the threshold); the lowest attack is {lowest:.4f}.\n\n"
            + "\n".join(lines) + f"\n\n({time.monotonic() - start:.0f} s)\n")
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
