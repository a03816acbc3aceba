"""The hostile pass's probes on unbounded reads and received values: FIFOs, devices, sparse and
decompression-bomb files in received folders, and values of the wrong type or range in them.

Each probe attacks the real command line (see :mod:`devtools.hostile`); the shared inputs (a small
suite, one real run folder) come from :mod:`devtools.hostile_probes`. What must hold (docs/runs.md,
"Reading limits"): the command neither hangs nor grows past a bounded memory, and refuses in one line
naming the file (and row and field, or its size and the limit), without a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from devtools.hostile import Probe, ProbeFailed, Workspace, contains, no_traceback, refused, succeeded
from devtools.hostile_probes import base_run, copy_run, leaderboard, records, report

GiB = 2**30
QUICK = 180.0  # seconds: a read that blocks (a FIFO) fails the probe in this time, not the pass's 600
MEMORY = 2 * GiB  # the most a command may reach on a bomb (an upper bound: see devtools.hostile.wait_measured)


def quick(ws: Workspace) -> Workspace:
    """``ws`` with a short command timeout (its shared inputs are the same objects)."""
    return dataclasses.replace(ws, timeout=QUICK)


def sparse(path: Path, size: int) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    with open(path, "wb") as f:
        f.truncate(size)


def plant(path: Path, what: str) -> None:
    """Put ``what`` at ``path``: a FIFO, a link to /dev/zero, a directory or a sparse file of that many GiB."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "dev-zero":
        path.symlink_to("/dev/zero")
    elif what == "directory":
        path.mkdir()
    else:
        sparse(path, int(what) * GiB)


def bounded(done, what: str) -> None:
    no_traceback(done)
    if done.peak_bytes is not None and done.peak_bytes > MEMORY:
        raise ProbeFailed(f"{what} peaked at {done.peak_bytes / GiB:.1f} GiB")


# ---------------------------------------------------------------- files of a run folder


def records_shard(what: str, said: str) -> Callable[[Workspace, Path], None]:
    """A probe: a run folder whose ``records.shard-0-of-2.jsonl`` is ``what`` (:func:`plant`)."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = copy_run(ws, folder)
        shard = run / "records.shard-0-of-2.jsonl"
        plant(shard, what)
        done = leaderboard(quick(ws), [run], folder / "board", measure=True)
        bounded(done, "leaderboard")
        refused(done, str(shard), said)

    return attack


def run_file(name: str) -> Callable[[Workspace, Path], None]:
    """A probe: a run folder whose ``name`` is a sparse 6 GiB file."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = copy_run(ws, folder)
        sparse(run / name, 6 * GiB)
        done = leaderboard(quick(ws), [run], folder / "board", measure=True)
        bounded(done, "leaderboard")
        refused(done, str(run / name), "6.0 GiB", "limit")

    return attack


def manifest(what: str, said: str) -> Callable[[Workspace, Path], None]:
    """A probe: ``validate`` on a ``metadata.jsonl`` that is ``what`` (:func:`plant`)."""

    def attack(ws: Workspace, folder: Path) -> None:
        root = folder / "data"
        root.mkdir()
        plant(root / "metadata.jsonl", what)
        done = quick(ws).cmbench("validate", "data=cmbench", f"data.root={root}", "data.check_counts=false",
                                 measure=True)
        bounded(done, "validate")
        refused(done, str(root / "metadata.jsonl"), said)

    return attack


# ---------------------------------------------------------------- a dataset a received run carries


def carried_dataset(ws: Workspace, folder: Path) -> tuple[Path, Path, Path]:
    """A copy of the shared run whose config.yaml's ``data.root`` is a copy of the suite inside it:
    (run, dataset root, the context npz of the run's first task)."""
    run = copy_run(ws, folder)
    root = run / "dataset"
    shutil.copytree(ws.root / "suite", root, symlinks=True)
    config = run / "config.yaml"
    config.write_text(re.sub(r"(?m)^(  root: ).*$", lambda m: f"{m.group(1)}{root}", config.read_text(), count=1))
    task = records(run)[0]["task_id"]
    rows = [json.loads(line) for line in (root / "metadata.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["task_id"] == task]
    return run, root, root / row["miniworld"]["context_frames"]


def npz_bomb(path: Path, gib: int) -> None:
    """An npz whose ``frames`` declares ``gib`` GiB of zeros (a few MiB compressed), streamed through
    deflate so the array is never in this process's memory either."""
    path.unlink()
    header = {"descr": "|u1", "fortran_order": False, "shape": (gib * 1024, 1024, 1024)}
    block = bytes(64 * 2**20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("frames.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            for _ in range(gib * 16):
                member.write(block)
        with archive.open("camera_x.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros(4, np.int64))


def carried_context(what: str, command: str) -> Callable[[Workspace, Path], None]:
    """A probe: ``command`` (report or validate) on a carried dataset whose first context npz is a
    decompression bomb (``what="bomb"``) or a FIFO."""

    def attack(ws: Workspace, folder: Path) -> None:
        run, root, context = carried_dataset(ws, folder)
        if what == "bomb":
            npz_bomb(context, 3)
        else:
            plant(context, "fifo")
        if command == "report":
            done = report(quick(ws), [run], folder / "report", measure=True)
        else:
            done = quick(ws).cmbench("validate", "data=miniworld", f"data.root={root}", "data.check_counts=false",
                                     *ws.suite_overrides[1:], measure=True)
        bounded(done, command)
        said = "over the 1.0 GiB limit of a context array" if what == "bomb" else "is a FIFO"
        contains(done.stdout + done.stderr, said, f"{command}'s output")
        contains(done.stdout + done.stderr, context.name, f"{command}'s output")

    return attack


# ---------------------------------------------------------------- videos


HUGE_FRAMES = """import sys, cv2, numpy as np
frame = np.full((8192, 8192, 3), 77, np.uint8)
writer = cv2.VideoWriter(sys.argv[1], cv2.VideoWriter.fourcc(*"FFV1"), 16.0, (8192, 8192))
for _ in range(16):
    writer.write(frame)
writer.release()
"""


def huge_frames_video(ws: Workspace) -> Path:
    """A 3 MB FFV1 mkv of 16 constant 8192x8192 frames (3.2 GB decoded), built once in a subprocess (the
    pass's own memory counts in the peak of every command it starts later)."""

    def build() -> Path:
        path = ws.root / "shared" / "huge_frames" / "frames.mkv"
        path.parent.mkdir(parents=True, exist_ok=True)
        succeeded(ws.python("-c", HUGE_FRAMES, str(path)))
        return path

    return ws.shared("huge_frames", build)  # type: ignore[return-value]


def score_of_huge_frames(ws: Workspace, folder: Path) -> None:
    task = records(base_run(ws))[0]["task_id"]
    videos = folder / "videos"
    videos.mkdir()
    shutil.copy(huge_frames_video(ws), videos / f"{task}.mkv")
    done = ws.cmbench("score", f"videos={videos}", f"out={folder / 'scores'}", *ws.suite_overrides, measure=True)
    bounded(done, "score")
    contains(done.stderr, "8192x8192 frames, over the", "score's line for the video")


# ---------------------------------------------------------------- received values


def changed_record(change: Callable[[dict], str], *said: str, command: str = "leaderboard"):
    """A probe: the first record of a run folder rewritten by ``change(row) -> line``; ``command`` must
    refuse it naming ``records.jsonl:1`` and ``said``."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = copy_run(ws, folder)
        lines = (run / "records.jsonl").read_text().splitlines()
        lines[0] = change(json.loads(lines[0]))
        (run / "records.jsonl").write_text("\n".join(lines) + "\n")
        done = (leaderboard if command == "leaderboard" else report)(ws, [run], folder / command)
        refused(done, "records.jsonl:1", *said)

    return attack


def field(name: str, value) -> Callable[[dict], str]:
    return lambda row: json.dumps({**row, name: value})


def score_1e999(row: dict) -> str:
    return re.sub(r'"score": [^,}]+', '"score": 1e999', json.dumps(row), count=1)


def changed_file(name: str, change: Callable[[str], str], *said: str, command: str = "leaderboard"):
    """A probe: a run folder whose ``name`` is rewritten by ``change(text)``; ``command`` must refuse it in
    one line naming the file and ``said``."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = copy_run(ws, folder)
        (run / name).write_text(change((run / name).read_text()))
        done = (leaderboard if command == "leaderboard" else report)(ws, [run], folder / command)
        refused(done, str(run / name), *said)

    return attack


def surrogate_label(text: str) -> str:
    return json.dumps({**json.loads(text), "label": "x"}).replace('"label": "x"', '"label": "a\\ud800b"')


def seed_2_to_the_70(ws: Workspace, folder: Path, command: str) -> None:
    """A run folder whose config.yaml's seed is 2**70 and whose run.json gives no run_seed (a folder written
    before run.json kept it): the seed is read from config.yaml."""
    run = copy_run(ws, folder)
    config = run / "config.yaml"
    config.write_text(re.sub(r"(?m)^seed: .*$", f"seed: {2**70}", config.read_text()))
    info = json.loads((run / "run.json").read_text())
    info.pop("run_seed", None)
    (run / "run.json").write_text(json.dumps(info))
    done = (leaderboard if command == "leaderboard" else report)(ws, [run], folder / command)
    refused(done, str(config), "seed", str(2**70))


def config_seed(command: str) -> Callable[[Workspace, Path], None]:
    return lambda ws, folder: seed_2_to_the_70(ws, folder, command)


CALIBRATE = ("calibrate", "method=decoprune", "target_pr=0.9", "calibration.tasks=1", "calibration.max_probes=2")


def calibration(ws: Workspace) -> Path:
    """An out_dir holding one real calibration of DeCoPrune to PR 0.9 (built once)."""

    def build() -> Path:
        out = ws.root / "shared" / "calibrated"
        succeeded(ws.cmbench(*CALIBRATE, f"out_dir={out}", *ws.suite_overrides))
        return out

    return ws.shared("calibration", build)  # type: ignore[return-value]


def calibration_log(key: str, value, said: str) -> Callable[[Workspace, Path], None]:
    """A probe: every log of the shared calibration with ``key`` set to ``value`` (its key unchanged, so it
    would be reused); ``calibrate`` must name the log and the field and calibrate again."""

    def attack(ws: Workspace, folder: Path) -> None:
        out = folder / "out"
        shutil.copytree(calibration(ws), out)
        logs = sorted(p for p in (out / "calibration").rglob("decoprune_pr90*.json"))
        for log in logs:
            text = json.dumps({**json.loads(log.read_text()), key: "PLACEHOLDER"}, indent=2)
            log.write_text(text.replace('"PLACEHOLDER"', value))
        done = ws.cmbench(*CALIBRATE, f"out_dir={out}", *ws.suite_overrides)
        no_traceback(done)
        line = next((x for x in done.stderr.splitlines() if "decoprune_pr90" in x and said in x), None)
        if line is None or "calibrating again" not in line:
            raise ProbeFailed(f"calibrate does not name the log and its {said} (stderr ends: "
                              f"{(done.stderr.strip().splitlines() or [''])[-1][:160]})")
        if "(reused)" in done.stdout or "reused (same calibration)" in done.stdout:
            raise ProbeFailed("calibrate reused the log")

    return attack


# ---------------------------------------------------------------- lock files of a run folder


def records_lock(what: str, said: str) -> Callable[[Workspace, Path], None]:
    """A probe: a run folder whose ``.records.jsonl.lock`` is ``what`` (:func:`plant`, or ``one``: a lock
    holding ``1``, PID 1 being no run's writer): the board is written, saying in one line that the lock
    names no writer; no hang, bounded memory."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = copy_run(ws, folder)
        lock = run / ".records.jsonl.lock"
        if what == "one":
            lock.write_text("1\n")
        else:
            plant(lock, what)
        done = leaderboard(quick(ws), [run], folder / "board", measure=True)
        bounded(done, "leaderboard")
        succeeded(done)
        line = next((x for x in done.stderr.splitlines() if str(lock) in x), "")
        contains(line, said, "the lock's line")
        contains(line, "names no writer", "the lock's line")

    return attack


def leaderboard_refuses_a_run_a_writer_on_another_host_still_fills(ws: Workspace, folder: Path) -> None:
    """A lock naming a process on another host (PID 4000000, not one of this host's) whose heartbeat is
    fresh: the board is refused, naming the host; once the heartbeat is stale, the board is written."""
    run = copy_run(ws, folder)
    lock = run / ".records.jsonl.lock"
    lock.write_text(json.dumps({"host": "node-b", "pid": 4000000, "start": 1}) + "\n")
    refused(leaderboard(quick(ws), [run], folder / "board"), str(run), "process 4000000 on node-b",
            "last heartbeat")
    os.utime(lock, (1, 1))
    succeeded(leaderboard(quick(ws), [run], folder / "board"))


PROBES: list[Probe] = [
    Probe("leaderboard-records-shard-fifo", records_shard("fifo", "is a FIFO")),
    Probe("leaderboard-records-shard-dev-zero-link", records_shard("dev-zero", "is a character device")),
    Probe("leaderboard-records-shard-sparse-8-gib", records_shard("8", "over the limit of a records line")),
    Probe("leaderboard-records-shard-directory", records_shard("directory", "is a directory")),
    Probe("leaderboard-sparse-6-gib-config-yaml", run_file("config.yaml")),
    Probe("leaderboard-sparse-6-gib-run-json", run_file("run.json")),
    Probe("leaderboard-sparse-6-gib-summary-json", run_file("summary.json")),
    Probe("validate-manifest-fifo", manifest("fifo", "is a FIFO")),
    Probe("validate-manifest-dev-zero-link", manifest("dev-zero", "is a character device")),
    Probe("validate-manifest-sparse-6-gib", manifest("6", "over the 256.0 MiB limit of a manifest")),
    Probe("report-carried-dataset-npz-bomb", carried_context("bomb", "report")),
    Probe("validate-carried-dataset-npz-bomb", carried_context("bomb", "validate")),
    Probe("report-carried-dataset-context-fifo", carried_context("fifo", "report")),
    Probe("validate-carried-dataset-context-fifo", carried_context("fifo", "validate")),
    Probe("score-ffv1-of-8192-square-frames", score_of_huge_frames),
    Probe("leaderboard-run-json-label-lone-surrogate", changed_file("run.json", surrogate_label, "label", "surrogate")),
    Probe("report-run-json-label-lone-surrogate", changed_file("run.json", surrogate_label, "label", "surrogate",
                                                               command="report")),
    Probe("leaderboard-config-seed-2-to-the-70", config_seed("leaderboard")),
    Probe("report-config-seed-2-to-the-70", config_seed("report")),
    Probe("leaderboard-recorded-ns-text", changed_record(field("recorded_ns", "yesterday"), "recorded_ns")),
    Probe("leaderboard-record-task-type-list", changed_record(field("task_type", ["reappear"]), "task_type")),
    Probe("leaderboard-record-source-dict", changed_record(field("source", {"a": 1}), "source")),
    Probe("leaderboard-record-context-id-int", changed_record(field("context_id", 7), "context_id")),
    Probe("leaderboard-record-code-hash-dict", changed_record(field("code_hash", {"a": 1}), "code_hash")),
    Probe("leaderboard-record-score-1e999", changed_record(score_1e999, "score")),
    Probe("report-best-box-strings", changed_record(field("best_box", ["a", "b", "c", "d"]), "best_box",
                                                    command="report")),
    Probe("report-best-box-one-number", changed_record(field("best_box", [0.1]), "best_box", command="report")),
    Probe("report-best-box-nested", changed_record(field("best_box", [[1], [2], [3], [4]]), "best_box",
                                                   command="report")),
    Probe("calibrate-log-value-1e308", calibration_log("value", "1e308", "value")),
    Probe("calibrate-log-calibration-pr-7-5", calibration_log("calibration_pr", "7.5", "calibration_pr")),
    Probe("calibrate-log-value-text", calibration_log("value", '"abc"', "value")),
    Probe("calibrate-log-value-nan", calibration_log("value", "NaN", "value")),
    Probe("leaderboard-records-lock-fifo", records_lock("fifo", "is a FIFO")),
    Probe("leaderboard-records-lock-dev-zero-link", records_lock("dev-zero", "is a link")),
    Probe("leaderboard-records-lock-sparse-8-gib", records_lock("8", "over the 4.0 KiB limit of a lock")),
    Probe("leaderboard-records-lock-holding-1", records_lock("one", "not a lock CMBench wrote")),
    Probe("leaderboard-records-lock-live-writer-on-another-host",
          leaderboard_refuses_a_run_a_writer_on_another_host_still_fills),
]
