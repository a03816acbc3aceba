"""The hostile pass's probes on submitted continuations that could game the score, and received values that must be refused with one line.

Each probe attacks the real command line (see :mod:`devtools.hostile`); the shared inputs (a small
suite, one real run folder) come from :mod:`devtools.hostile_probes`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from devtools.hostile import Probe, ProbeFailed, Workspace, contains, refused, succeeded, wait_for
from devtools.hostile_probes import base_run, copy_run, leaderboard, records, score


def _frames(path: Path) -> np.ndarray:
    from cmbench.data.video import read_video

    return read_video(path)[0]


def glued_continuation_scores_as_its_defined_frames(ws: Workspace, folder: Path) -> None:
    """Each task's 16 frames followed by another task's 16: scored as the first 16 alone, the record says
    32 came and 16 were scored, and the leaderboard flags the entry."""
    from cmbench.data.video import write_lossless_video

    run = base_run(ws)
    rows = records(run)
    glued = folder / "glued"
    glued.mkdir()
    for row, other in zip(rows, rows[1:] + rows[:1]):
        frames = np.concatenate([_frames(run / row["video"]), _frames(run / other["video"])])
        write_lossless_video(glued / f"{row['task_id']}.mkv", frames, 16)
    succeeded(score(ws, glued, folder / "scores"))
    scored = {r["task_id"]: r for r in records(folder / "scores")}
    for row in rows:
        got = scored[row["task_id"]]
        if (got.get("frames_received"), got.get("n_frames")) != (2 * row["n_frames"], row["n_frames"]):
            raise ProbeFailed(f"{row['task_id']}: the record says {got.get('frames_received')} frames came and "
                              f"{got.get('n_frames')} were scored, not {2 * row['n_frames']} and {row['n_frames']}")
        if got["score"] != row["score"]:
            raise ProbeFailed(f"{row['task_id']}: the glued continuation scored {got['score']}, its own 16 frames "
                              f"{row['score']}: frames past the task's were scored")
    succeeded(leaderboard(ws, [folder / "scores"], folder / "board"))
    contains((folder / "board" / "leaderboard.md").read_text(), "‡", "leaderboard.md flags the entry")


def short_continuation_is_scored_as_missing(ws: Workspace, folder: Path) -> None:
    from cmbench.data.video import write_lossless_video

    run = base_run(ws)
    row = records(run)[0]
    short = folder / "short"
    short.mkdir()
    write_lossless_video(short / f"{row['task_id']}.mkv", _frames(run / row["video"])[:4], 16)
    done = score(ws, short, folder / "scores")
    contains(done.stderr, "the task defines 16", "score's line on the short continuation")
    got = records(folder / "scores")[0]
    if got["status"] != "failed" or got.get("frames_received") != 4:
        raise ProbeFailed(f"a 4-frame continuation was recorded {got['status']} with frames_received="
                          f"{got.get('frames_received')}, not failed with 4")


def still_continuation_has_undefined_quality(ws: Workspace, folder: Path) -> None:
    """Each task's first frame repeated 16 times (one task black instead): the frame-comparing quality
    metrics are undefined (empty, with the reason), never VBench's perfect 1 for a frozen video, and the
    leaderboard shows them undefined with the count."""
    from cmbench.data.video import write_lossless_video

    run = base_run(ws)
    rows = records(run)
    still = folder / "still"
    still.mkdir()
    for i, row in enumerate(rows):
        frames = _frames(run / row["video"])
        frozen = np.zeros_like(frames) if i == 0 else np.repeat(frames[:1], len(frames), axis=0)
        write_lossless_video(still / f"{row['task_id']}.mkv", frozen, 16)
    succeeded(score(ws, still, folder / "scores"))
    for got in records(folder / "scores"):
        reason = (got.get("quality_absent") or {}).get("temporal_flickering", "")
        if got.get("temporal_flickering") is not None or not reason.startswith("undefined: "):
            raise ProbeFailed(f"{got['task_id']}: a still continuation has temporal_flickering="
                              f"{got.get('temporal_flickering')} (reason {reason!r}), not undefined")
    succeeded(leaderboard(ws, [folder / "scores"], folder / "board"))
    text = (folder / "board" / "leaderboard.md").read_text()
    contains(text, f" {len(rows)} of {len(rows)} tasks.",
             "leaderboard.md's count of undefined tasks")
    contains(text, "| undefined |", "leaderboard.md's undefined quality cell")


def run_refuses(override: str, *names: str):
    """A probe: ``run <override>`` is refused in one line naming ``names`` and leaves no run."""

    def attack(ws: Workspace, folder: Path) -> None:
        out = folder / "runs"
        done = ws.cmbench("run", "method=streaming", "limit=1", f"out_dir={out}", "progress=false",
                          *ws.suite_overrides, override)
        refused(done, *names)
        if out.exists() and any(out.rglob("records*.jsonl")):
            raise ProbeFailed(f"{override} left a run behind")

    return attack


def command_refuses(*args: str, names: tuple[str, ...]):
    """A probe: ``python -m cmbench *args`` is refused in one line naming ``names`` before any work."""

    def attack(ws: Workspace, folder: Path) -> None:
        refused(ws.cmbench(*args), *names)

    return attack


def data_root_a_file(ws: Workspace, folder: Path) -> None:
    path = folder / "data.txt"
    path.write_text("not a dataset")
    run_refuses(f"data.root={path}", "data.root", "not a folder")(ws, folder)


def allow_mixed_maybe(ws: Workspace, folder: Path) -> None:
    done = leaderboard(ws, [base_run(ws)], folder / "board", "leaderboard.allow_mixed=maybe")
    refused(done, "leaderboard.allow_mixed", "true or false")


def labels_differing_in_case_are_two_entries_told_apart(ws: Workspace, folder: Path) -> None:
    first = copy_run(ws, folder / "a", label="Mine")
    second = copy_run(ws, folder / "b", label="mine")
    second = second.rename(second.with_name(f"other_{second.name}"))  # another folder name to tell it by
    succeeded(leaderboard(ws, [first, second], folder / "board", "leaderboard.allow_mixed=true"))
    names = [line.split("|")[1].strip() for line in (folder / "board" / "leaderboard.md").read_text().splitlines()
             if line.lower().startswith("| mine")][:2]  # the leaderboard's own table comes first
    if len(names) != 2 or names[0].casefold() == names[1].casefold():
        raise ProbeFailed(f"the board shows {names}: entries whose labels differ only in case are not told apart")


def received_label_with_control_characters(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder, label="evil\x1b[2J\nrow\x00")
    succeeded(leaderboard(ws, [run], folder / "board"))
    text = (folder / "board" / "leaderboard.md").read_text() + (folder / "board" / "leaderboard.csv").read_text()
    for char in ("\x1b", "\x00"):
        if char in text:
            raise ProbeFailed(f"the board holds the raw control character {char!r} of a received label")


def ctrl_c_during_run(ws: Workspace, folder: Path) -> None:
    out = folder / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "cmbench", "run", "method=streaming", "limit=3", f"out_dir={out}",
                             "progress=false", *ws.suite_overrides], cwd=ws.root, env=ws.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def one_record() -> bool:
        return any(f.stat().st_size for f in out.rglob("records.jsonl")) if out.exists() else False

    wait_for(one_record, proc, 300, "the run wrote its first record")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        raise ProbeFailed("a run interrupted by Ctrl-C exited 0")
    lines = [line for line in err.splitlines() if line.strip()]
    if "Traceback" in err or not lines or "records kept; rerun to resume" not in lines[-1]:
        raise ProbeFailed(f"Ctrl-C ended the run with {lines[-1:]!r}{' and a traceback' if 'Traceback' in err else ''}")


PROBES: list[Probe] = [
    Probe("score-glued-continuation-scores-its-defined-frames", glued_continuation_scores_as_its_defined_frames),
    Probe("score-short-continuation-scored-as-missing", short_continuation_is_scored_as_missing),
    Probe("score-still-continuation-quality-undefined", still_continuation_has_undefined_quality),
    Probe("run-threads-a-million", run_refuses("threads=1000000", "threads=1000000", "at most")),
    Probe("run-seed-2-to-the-70", run_refuses(f"seed={2**70}", "seed=", "at most")),
    Probe("run-shard-count-2.5", run_refuses("shard.count=2.5", "shard.count=2.5")),
    Probe("run-unknown-root-key", run_refuses("+foo=1", "foo", "unknown")),
    Probe("run-unknown-generation-key", run_refuses("+generation.bogus=2", "generation.bogus", "unknown")),
    Probe("run-label-parent-path", run_refuses("label=../../evil", "label=../../evil")),
    Probe("run-label-pipe", run_refuses("label=a|b", "label=a|b")),
    Probe("run-label-newline", run_refuses("label='a\nb'", "label=", "control character")),
    Probe("run-data-root-a-file", data_root_a_file),
    Probe("run-data-root-slash", run_refuses("data.root=/", "data.root=/")),
    Probe("run-data-root-dev-zero", run_refuses("data.root=/dev/zero", "data.root=/dev/zero")),
    Probe("check-100000-context-chunks", command_refuses("check", "check.context_chunks=100000",
                                                         names=("check.context_chunks=100000", "at most"))),
    Probe("plan-a-billion-continuation-frames", command_refuses(
        "plan", "generation.continuation_frames=1000000000",
        names=("generation.continuation_frames=1000000000", "at most"))),
    Probe("leaderboard-allow-mixed-maybe", allow_mixed_maybe),
    Probe("leaderboard-labels-differing-in-case", labels_differing_in_case_are_two_entries_told_apart),
    Probe("leaderboard-received-label-control-characters", received_label_with_control_characters),
    Probe("run-ctrl-c-one-line", ctrl_c_during_run),
]
"""Every probe of this module, in the order they run."""
