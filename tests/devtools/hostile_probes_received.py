"""The hostile pass's probes on received data that must never steer code or outrank a real model.

A received calibration folder (a forged log's ``yaml`` field, a forged method yaml, a forged knob value
inside the knob's range), continuations that copy the context (the reference frame sixteen times, with
and without noise; the context replayed at 64x64), storage choices that cannot run (an unknown format, a
knob the format lacks, a merging method in a quantized format), a received record's impossible
``kv_bytes_ratio``, and Ctrl-C during a calibration. Each probe attacks the real command line (see
:mod:`devtools.hostile`); the shared inputs (a small suite, one real run folder) come from
:mod:`devtools.hostile_probes`.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from devtools.hostile import Outcome, Probe, ProbeFailed, Workspace, absent, contains, lacks, refused, succeeded, wait_for
from devtools.hostile_probes import base_run, copy_run, leaderboard, records, score

CALIBRATE = ("calibrate", "method=streaming", "target_pr=0.5", "calibration.tasks=1", "calibration.max_probes=4",
             "progress=false")
EVIL_YAML = "_target_: payload.Evil\nname: streaming\n"


def _calibrate(ws: Workspace, out: Path, *extra: str) -> Outcome:
    return ws.cmbench(*CALIBRATE, f"out_dir={out}", *ws.suite_overrides, *extra)


def shared_calibration(ws: Workspace) -> Path:
    """An ``out_dir`` holding one real calibration (streaming to PR 0.5 on one calibration task), built once."""

    def build() -> Path:
        out = ws.root / "shared-calibration"
        done = _calibrate(ws, out)
        if done.returncode != 0:
            raise ProbeFailed(f"the shared calibration failed: {done.stderr.strip().splitlines()[-1:]}")
        return out

    return ws.shared("streaming calibration to PR 0.5", build)  # type: ignore[return-value]


def _own_calibration(ws: Workspace, folder: Path) -> Path:
    out = folder / "runs"
    shutil.copytree(shared_calibration(ws), out)
    return out


def _logs(out: Path) -> list[Path]:
    """The calibration's logs: the one named after the target and the one under its key."""
    base = out / "calibration"
    return [base / "streaming_pr50.json", *sorted((base / "keyed").glob("streaming_pr50_*.json"))]


def _forge(out: Path, **change) -> None:
    for log in _logs(out):
        log.write_text(json.dumps({**json.loads(log.read_text()), **change}, indent=2) + "\n")


def _run_line(done: Outcome) -> str:
    lines = [line.strip() for line in done.stdout.splitlines() if "-m cmbench run" in line]
    if len(lines) != 1:
        raise ProbeFailed(f"calibrate printed {len(lines)} run lines, not one")
    return lines[0]


def forged_log_chooses_no_config_folder(ws: Workspace, folder: Path) -> None:
    """A received calibration log whose ``yaml`` and ``log`` fields point at a folder elsewhere holding a
    method yaml that imports a payload: the run line's ``CMBENCH_CONFIG_PATH`` is the calibration's own
    folder, the label is CMBench's, and "wrote"/"kept" name only the folder's own files."""
    out = _own_calibration(ws, folder)
    elsewhere = folder / "elsewhere"
    (elsewhere / "method").mkdir(parents=True)
    (elsewhere / "method" / "streaming_pr50.yaml").write_text(EVIL_YAML)
    _forge(out, yaml=str(elsewhere / "method" / "streaming_pr50.yaml"), log=str(elsewhere / "log.json"),
           label="fullkv")
    done = _calibrate(ws, out)
    succeeded(done)
    line = _run_line(done)
    lacks(line, str(elsewhere), "the printed run line")
    contains(line, f"CMBENCH_CONFIG_PATH={out.resolve() / 'calibration'}", "the printed run line")
    contains(line, "label=streaming@pr50", "the printed run line")
    named = [w for w in done.stdout.splitlines() if w.startswith(("wrote ", "kept "))]
    if len(named) != 1 or str(elsewhere) in named[0]:
        raise ProbeFailed(f"calibrate said {named!r} about the files it wrote")
    if any(str(elsewhere) in log.read_text() for log in _logs(out)):
        raise ProbeFailed("the forged yaml field is still in the calibration's logs")


def forged_method_yaml_is_rewritten(ws: Workspace, folder: Path) -> None:
    """The folder's method yaml replaced by one importing a payload, its log left as it was: the yaml is
    rewritten as CMBench writes it for the log, and the line says it was written."""
    out = _own_calibration(ws, folder)
    yaml = out / "calibration" / "method" / "streaming_pr50.yaml"
    yaml.write_text(EVIL_YAML)
    done = _calibrate(ws, out)
    succeeded(done)
    lacks(yaml.read_text(), "payload", "the calibration's method yaml")
    contains(done.stdout, f"wrote {yaml}", "calibrate's line on the files it wrote")


def forged_value_in_range_is_not_trusted(ws: Workspace, folder: Path) -> None:
    """The logs' value set to 0 (inside Streaming's window range, none of the probes): not reused, the
    calibration is made again from its probe cache (its search may go on past the honest one's last probe),
    and the logs then hold a value the search measured, not the forged 0."""
    out = _own_calibration(ws, folder)
    _forge(out, value=0)
    done = _calibrate(ws, out)
    succeeded(done)
    contains(done.stderr, "value: recent_chunks=0 is none of the log's", "calibrate's line on the forged log")
    lacks(done.stdout, "recent_chunks=0 ", "calibrate's result")
    for log in _logs(out)[:1]:
        logged = json.loads(log.read_text())
        if logged["value"] == 0 or logged["value"] not in [v for v, _ in logged["probes"] + logged["reused_probes"]]:
            raise ProbeFailed(f"{log.name} holds recent_chunks={logged['value']}, not a value the search measured")


def _suite_frames(ws: Workspace, task_id: str) -> tuple[np.ndarray, np.ndarray]:
    """A task's context frames and its reference frame, from the shared suite (lossless)."""
    from cmbench.data import load_manifest
    from cmbench.miniworld.readers import extension, load_context

    (task,) = [t for t in load_manifest(ws.root / "suite", "metadata.jsonl") if t.task_id == task_id]
    context, _ = load_context(task)
    fps = float(extension(task).get("fps", 16))
    return context, context[task.references[0].frame_at(fps, native=True)]


def _submit(ws: Workspace, folder: Path, name: str, make) -> Path:
    """Score a folder of continuations ``make(context, reference) -> uint8 [F, H, W, 3]`` for the shared run's
    tasks; the score folder (its records checked suspect, never failed)."""
    from cmbench.data.video import write_lossless_video

    videos = folder / name
    videos.mkdir()
    for row in records(base_run(ws)):
        write_lossless_video(videos / f"{row['task_id']}.mkv", make(*_suite_frames(ws, row["task_id"])), 16)
    out = folder / f"{name}-scores"
    succeeded(score(ws, videos, out, f"label={name}"))
    for row in records(out):
        if row["status"] != "ok":
            raise ProbeFailed(f"{name}: task {row['task_id']} was recorded {row['status']}: {row.get('error')}")
        if not row.get("suspect"):
            raise ProbeFailed(f"{name}: task {row['task_id']} is not flagged suspect (continuity "
                              f"{row.get('continuity')})")
    return out


def _never_outranks(ws: Workspace, folder: Path, name: str, make) -> None:
    """The submission's entry is flagged and listed after the real run whatever its score."""
    out = _submit(ws, folder, name, make)
    succeeded(leaderboard(ws, [base_run(ws), out], folder / "board"))
    table = (folder / "board" / "leaderboard.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    entries = [r for r in rows[1:3]]
    if len(entries) != 2 or not entries[1].startswith(name) or "§" not in entries[1]:
        raise ProbeFailed(f"the board lists {entries}: the copy is not flagged and listed after the real run")


def copied_reference_frame_never_outranks(ws: Workspace, folder: Path) -> None:
    rng = np.random.default_rng(0)
    _never_outranks(ws, folder, "copier", lambda context, ref: np.clip(
        ref[None].astype(int) + rng.integers(-3, 4, (16, *ref.shape)), 0, 255).astype(np.uint8))


def exact_reference_copy_is_recorded_not_failed(ws: Workspace, folder: Path) -> None:
    """Without noise a frame identical to its reference: a cosine rounded past 1 is a similarity of 1, the
    task is recorded (flagged), not failed."""
    _never_outranks(ws, folder, "exact", lambda context, ref: np.repeat(ref[None], 16, axis=0))


def context_replay_at_64_never_outranks(ws: Workspace, folder: Path) -> None:
    import cv2

    _never_outranks(ws, folder, "replay", lambda context, ref: np.stack(
        [cv2.resize(f, (64, 64), interpolation=cv2.INTER_NEAREST) for f in context[:16]]))


def refused_before_any_folder(*args: str, names: tuple[str, ...]):
    """A probe: ``python -m cmbench *args`` (with an out_dir of its own) refused in one line naming ``names``,
    leaving no folder (no run, no calibration)."""

    def attack(ws: Workspace, folder: Path) -> None:
        out = folder / "runs"
        refused(ws.cmbench(*args, f"out_dir={out}", "limit=1", "progress=false", *ws.suite_overrides), *names)
        absent(out, "a folder was left behind")

    return attack


def received_kv_bytes_ratio(value: float, pr: float):
    """A probe: a received record's ``kv_bytes_ratio`` set to ``value`` at PR ``pr``: the board refuses in
    one line naming the file, the row and the field, never a percentage."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = copy_run(ws, folder)
        rows = records(run)
        rows[0].update(kv_bytes_ratio=value, pr=pr)
        (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        done = leaderboard(ws, [run], folder / "board")
        refused(done, "records.jsonl:1", "kv_bytes_ratio")
        lacks(done.stdout + done.stderr, "inf%", "the leaderboard's output")

    return attack


def ctrl_c_during_calibrate(ws: Workspace, folder: Path) -> None:
    """Ctrl-C once the first probe is measured: one line saying how many finished probes are kept and where,
    and the probe cache holds them."""
    out = folder / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "cmbench", "calibrate", "method=decoprune", "target_pr=0.5",
                             "calibration.tasks=1", "calibration.tolerance=0.0001", "calibration.max_probes=12",
                             "progress=false", f"out_dir={out}", *ws.suite_overrides], cwd=ws.root, env=ws.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def one_probe() -> bool:
        return any((out / "calibration" / "keyed").glob("decoprune_probes_*.json")) if out.exists() else False

    wait_for(one_probe, proc, 300, "the calibration kept its first probe")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    if proc.returncode == 0 or "Traceback" in err or not lines:
        raise ProbeFailed(f"Ctrl-C ended calibrate with status {proc.returncode}: {lines[-1:]!r}")
    (kept,) = (out / "calibration" / "keyed").glob("decoprune_probes_*.json")
    count = len(json.loads(kept.read_text())["probes"])
    contains(lines[-1], f"cmbench: interrupted; {count} finished probe", "calibrate's last line")
    contains(lines[-1], f"kept in {kept}", "calibrate's last line")


PROBES: list[Probe] = [
    Probe("calibrate-forged-log-chooses-no-config-folder", forged_log_chooses_no_config_folder),
    Probe("calibrate-forged-method-yaml-is-rewritten", forged_method_yaml_is_rewritten),
    Probe("calibrate-forged-value-in-range-not-trusted", forged_value_in_range_is_not_trusted),
    Probe("score-copied-reference-frame-never-outranks", copied_reference_frame_never_outranks),
    Probe("score-exact-reference-copy-recorded-not-failed", exact_reference_copy_is_recorded_not_failed),
    Probe("score-context-replay-at-64-never-outranks", context_replay_at_64_never_outranks),
    Probe("run-merging-method-in-kivi-with-bytes-target", refused_before_any_folder(
        "run", "method=tempcache", "storage=kivi", "method.target_bytes=0.1", names=("tempcache", "storage=kivi"))),
    Probe("run-merging-method-in-kivi", refused_before_any_folder(
        "run", "method=tempcache", "storage=kivi", names=("tempcache", "storage=kivi"))),
    Probe("calibrate-merging-method-in-qvg", refused_before_any_folder(
        "calibrate", "method=tempcache", "storage=qvg", "target_bytes=0.1", names=("tempcache", "storage=qvg"))),
    Probe("run-storage-nope", refused_before_any_folder("run", "method=streaming", "storage=nope",
                                                        names=("storage=nope", "choose one of", "kivi"))),
    Probe("run-kivi-stages-2", refused_before_any_folder("run", "method=streaming", "storage=kivi",
                                                         "storage.stages=2", names=("storage.stages=2", "kivi"))),
    Probe("run-fp-bits-2", refused_before_any_folder("run", "method=streaming", "storage=fp", "storage.bits=2",
                                                     names=("storage.bits=2", "storage=fp"))),
    Probe("leaderboard-received-kv-bytes-ratio-1e308", received_kv_bytes_ratio(1e308, 0.0)),
    Probe("leaderboard-received-kv-bytes-ratio-50-at-pr-0", received_kv_bytes_ratio(50.0, 0.0)),
    Probe("calibrate-ctrl-c-one-line", ctrl_c_during_calibrate),
]
