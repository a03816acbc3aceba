"""The hostile pass: every probe, each named by what it attacks (``scripts/hostile_probes.py`` runs them).

Run folders, score folders, manifests and videos are data that may come from someone else (docs/runs.md,
"Trust"); configs name code. Each probe below attacks the real command line as a subprocess and checks
what must hold afterwards (:mod:`devtools.hostile`): no payload ran (a marker file it would
create is absent), a link's target is unchanged, earlier records are kept, a bad input is refused with
one line naming the file or key and no traceback.

Shared inputs are built once: one small MiniWorld suite and one real run on it (``run method=streaming
limit=2`` with the committed tiny model); a probe that needs a run folder works on its own copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devtools.hostile import (REPO, Outcome, Probe, ProbeFailed, Workspace, absent, contains, lacks, no_traceback,
                                        refused, same_bytes, snapshot, succeeded, unchanged, wait_for)
from cmbench.runs.output_folder import transient

SMALL_SUITE = [  # 3 contexts, 4 tasks: the suite the run tests use
    "data.clip_frames=24", "data.min_absence_frames=16", "data.sources.synthetic.videos=2",
    "data.sources.synthetic.reappear=2", "data.sources.synthetic.revisit=1", "data.sources.real.videos=1",
    "data.sources.real.reappear=1", "data.sources.real.revisit=0",
]
PAYLOAD = """from pathlib import Path
Path({marker!r}).write_text("the payload ran")
from cmbench.data.adapter import DatasetAdapter
class X(DatasetAdapter):
    pass
"""
HOSTILE_LABEL = "<script>alert(1)</script> | *x*"


def new_workspace(root: Path) -> Workspace:
    root.chmod(0o755)
    return Workspace(root, [f"data.root={root / 'suite'}", *SMALL_SUITE])


# ---------------------------------------------------------------- shared inputs


def base_run(ws: Workspace) -> Path:
    """The one real run folder (built on first use): streaming on 2 tasks of the small suite."""

    def build() -> Path:
        out = ws.root / "shared" / "runs"
        done = ws.cmbench("run", "method=streaming", "limit=2", f"out_dir={out}", "progress=false", *ws.suite_overrides)
        if done.returncode != 0:
            raise ProbeFailed(f"the shared run failed: {done.stderr.strip().splitlines()[-1:]}")
        (run,) = [p for p in (out / "miniworld").iterdir() if p.is_dir() and p.name != "leaderboard"]
        return run

    return ws.shared("run", build)  # type: ignore[return-value]


def copy_run(ws: Workspace, folder: Path, label: str | None = None) -> Path:
    """A copy of the shared run under ``folder/runs/miniworld/`` (relabelled when ``label`` is given)."""
    source = base_run(ws)
    name = source.name if label is None else f"{re.sub(r'[^a-z0-9]+', '_', label.lower())}__{source.name}"
    run = folder / "runs" / "miniworld" / name
    shutil.copytree(source, run, symlinks=True)
    if label is not None:
        rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
        for row in rows:
            row["label"] = label
        (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**info, "label": label}) + "\n")
    return run


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def report(ws: Workspace, runs: list[Path], out: Path, *extra: str, **kwargs) -> Outcome:
    return ws.cmbench("report", f"runs=[{','.join(map(str, runs))}]", f"report.out={out}", *extra, **kwargs)


def leaderboard(ws: Workspace, runs: list[Path], out: Path, *extra: str, **kwargs) -> Outcome:
    return ws.cmbench("leaderboard", f"runs=[{','.join(map(str, runs))}]", f"leaderboard.out={out}", *extra, **kwargs)


def score(ws: Workspace, videos: Path, out: Path, *extra: str) -> Outcome:
    return ws.cmbench("score", f"videos={videos}", f"out={out}", *ws.suite_overrides, *extra)


def config_folder(folder: Path, files: dict[str, str]) -> Path:
    """A ``CMBENCH_CONFIG_PATH`` folder holding ``files`` (group/name.yaml -> text)."""
    root = folder / "configs"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# ---------------------------------------------------------------- code named by received folders


def plant_adapter(ws: Workspace, folder: Path) -> tuple[Path, Path, str]:
    """A received run whose config.yaml names an adapter module it carries (``payload.py``): (run, marker,
    adapter). The module is importable as ``runs.miniworld.<dir>.payload`` from ``folder``, the working
    directory, which ``python -m`` puts on the import path."""
    run = copy_run(ws, folder)
    marker = folder / "PAYLOAD_RAN"
    (run / "payload.py").write_text(PAYLOAD.format(marker=str(marker)))
    adapter = f"runs.miniworld.{run.name}.payload:X"
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("  adapter: miniworld\n", f"  adapter: {adapter}\n"))
    return run, marker, adapter


def report_imports_no_adapter_a_run_folder_names(ws: Workspace, folder: Path) -> None:
    run, marker, adapter = plant_adapter(ws, folder)
    done = report(ws, [run], folder / "report", cwd=folder)
    absent(marker, "report imported the run folder's adapter")
    no_traceback(done)


def leaderboard_imports_no_adapter_a_run_folder_names(ws: Workspace, folder: Path) -> None:
    run, marker, adapter = plant_adapter(ws, folder)
    done = leaderboard(ws, [run], folder / "board", cwd=folder)
    absent(marker, "leaderboard imported the run folder's adapter")
    no_traceback(done)


def resumed_run_imports_no_adapter_its_folder_names(ws: Workspace, folder: Path) -> None:
    run, marker, adapter = plant_adapter(ws, folder)
    done = ws.cmbench("run", "method=streaming", "limit=2", f"out_dir={folder / 'runs'}", "progress=false",
                      *ws.suite_overrides, cwd=folder)
    absent(marker, "the resumed run imported its folder's adapter")
    succeeded(done)
    contains(done.stdout, "(0 run now, 2 cached)", "the resumed run")


def report_runs_no_standard_module_a_run_folder_names(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("  adapter: miniworld\n", "  adapter: this.Zen\n"))
    done = report(ws, [run], folder / "report")
    lacks(done.stdout + done.stderr, "Beautiful is better than ugly", "report imported `this`")
    no_traceback(done)


def config_group_target_os_system(group: str, message: str) -> Callable[[Workspace, Path], None]:
    """A probe: a ``<group>/evil.yaml`` on ``CMBENCH_CONFIG_PATH`` whose ``_target_`` is ``os.system`` is
    refused with ``message`` before it is called."""

    def probe(ws: Workspace, folder: Path) -> None:
        marker = folder / "SYSTEM_RAN"
        configs = config_folder(folder, {f"{group}/evil.yaml": f"name: evil\n_target_: os.system\ncommand: touch {marker}\n"})
        done = ws.cmbench("run", f"{group}=evil", "limit=1", f"out_dir={folder / 'runs'}", *ws.suite_overrides,
                          env=ws.env(CMBENCH_CONFIG_PATH=str(configs)))
        absent(marker, "os.system ran")
        refused(done, message)

    return probe


# ---------------------------------------------------------------- files outside the output folder


def score_writes_through_no_link_in_its_output_folder(ws: Workspace, folder: Path) -> None:
    """Earlier scores whose files were replaced by links to copies of them elsewhere: a rescore replaces
    the links with files of its own and leaves the copies (someone's files) as they were."""
    run = base_run(ws)
    out = folder / "scores"
    succeeded(score(ws, run / "videos", out))
    victims = {}
    for name in ("records.jsonl", "config.yaml", "summary.json"):
        victim = folder / f"victim_{name}"
        (out / name).rename(victim)
        (out / name).symlink_to(victim)
        victims[victim] = victim.read_bytes()
    no_traceback(score(ws, run / "videos", out))
    for victim, content in victims.items():
        same_bytes(victim, content, "a file a link in score's output folder points to")


def score_over_a_finished_run_folder(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)
    before = snapshot(run)
    done = score(ws, run / "videos", run)
    refused(done, f"out={run}", "holds the records of a run")
    unchanged(run, before, "the run folder score was pointed at")


def report_shows_no_video_outside_its_run(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)
    rows = records(run)
    secret = folder / "secret" / "holiday.mkv"
    secret.parent.mkdir()
    shutil.copy(run / rows[0]["video"], secret)
    for row in rows:
        (run / row["video"]).unlink()
        (run / row["video"]).with_suffix(".mp4").unlink()
    rows[0]["video"] = str(secret)  # an absolute path anywhere on the reader's disk
    rows[1]["video"] = os.path.relpath(secret, run)  # or out of the folder by ..
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = report(ws, [run], folder / "report")
    succeeded(done)
    page = (folder / "report" / "index.html").read_text()
    lacks(page, "holiday", "the report page")
    if page.count("outside its folder") != 2:
        raise ProbeFailed(f"the page says {page.count('outside its folder')} video(s) are outside their folder, not 2")


def report_out_over_a_users_folder(ws: Workspace, folder: Path) -> None:
    run = base_run(ws)
    photos = folder / "photos"
    (photos / "img").mkdir(parents=True)
    (photos / "img" / "precious.jpg").write_bytes(b"a user's photo")
    before = snapshot(photos)
    done = report(ws, [run], photos)
    refused(done, str(photos), "not empty")
    unchanged(photos, before, "the user's folder")


def run_writes_through_no_link_in_its_folder(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)
    victims = {}
    for name in ("config.yaml", "run.json", "summary.json"):
        victim = folder / f"victim_{name}"
        victim.write_bytes(b"precious\n")
        (run / name).unlink()
        (run / name).symlink_to(victim)
        victims[victim] = b"precious\n"
    done = ws.cmbench("run", "method=streaming", "limit=2", f"out_dir={folder / 'runs'}", "progress=false",
                      *ws.suite_overrides)
    no_traceback(done)
    for victim, content in victims.items():
        same_bytes(victim, content, "a file a link in the run folder points to")


# ---------------------------------------------------------------- lost or torn results


def killed_rescore_keeps_the_earlier_records(ws: Workspace, folder: Path) -> None:
    run = base_run(ws)
    out = folder / "scores"
    args = ["-m", "cmbench", "score", f"videos={run / 'videos'}", f"out={out}", *ws.suite_overrides]
    succeeded(ws.python(*args))
    before = snapshot(out)
    proc = ws.start(*args)
    wait_for(lambda: any(out.glob(".records.jsonl*.tmp")), proc, 300, "the rescore started writing records")
    killed(proc)
    kept = {n: b for n, b in snapshot(out).items() if not transient(Path(n).name)}  # the killed writer's own
    if kept != before:
        raise ProbeFailed(f"a rescore killed while writing changed {sorted(set(kept) ^ set(before)) or 'the records'}")
    again = ws.python(*args)
    succeeded(again)
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    if leftovers:
        raise ProbeFailed(f"the next score left the killed one's partial files: {leftovers}")
    if len(records(out)) != len(before["records.jsonl"].splitlines()):
        raise ProbeFailed("the next score wrote another number of records")


def killed(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``; the probe fails when it had already ended (then nothing was tested)."""
    proc.send_signal(signal.SIGKILL)
    if proc.wait() != -signal.SIGKILL:
        raise ProbeFailed(f"the command ended (status {proc.returncode}) before it was killed: nothing was tested")


def board_with_curves(ws: Workspace, folder: Path, curves: bytes, reason: str) -> None:
    path = folder / "curves.csv"
    path.write_bytes(curves)
    done = leaderboard(ws, [base_run(ws)], folder / "board", f"leaderboard.curves={path}")
    refused(done, str(path), reason)


def empty_curves_file(ws: Workspace, folder: Path) -> None:
    board_with_curves(ws, folder, b"", "empty")


def torn_curves_file(ws: Workspace, folder: Path) -> None:
    whole = (REPO / "results" / "miniworld" / "curves.csv").read_bytes()
    cut = whole.index(b"\n", len(whole) // 2) - 20  # inside a row: the rest never reached the disk
    board_with_curves(ws, folder, whole[:cut], "torn")


def report_with_a_torn_curves_file(ws: Workspace, folder: Path) -> None:
    whole = (REPO / "results" / "miniworld" / "curves.csv").read_bytes()
    torn = folder / "curves.csv"
    torn.write_bytes(whole[: whole.index(b"\n", len(whole) // 2) - 20])
    refused(report(ws, [base_run(ws)], folder / "report", f"leaderboard.curves={torn}"), str(torn), "torn")


def killed_report_keeps_the_previous_page(ws: Workspace, folder: Path) -> None:
    run = base_run(ws)
    out = folder / "report"
    succeeded(report(ws, [run], out))
    before = snapshot(out)
    args = ["-m", "cmbench", "report", f"runs=[{run}]", f"report.out={out}"]
    proc = ws.start(*args)
    wait_for(lambda: any(p.name.startswith(".report") for p in folder.iterdir()), proc, 300,
             "the report started building")
    time.sleep(0.5)
    killed(proc)
    unchanged(out, before, "the previous report, after a report was killed while building")
    succeeded(report(ws, [run], out))
    left = [p.name for p in folder.iterdir() if p.name.startswith(".report")]
    if left:
        raise ProbeFailed(f"the next report left the killed one's build folder: {left}")


def killed_leaderboards_build_folders_are_cleaned(ws: Workspace, folder: Path) -> None:
    dead = folder / ".board.tmp-999999999"  # no such process: a leaderboard killed while building
    dead.mkdir()
    (dead / "leaderboard.csv").write_text("half")
    succeeded(leaderboard(ws, [base_run(ws)], folder / "board"))
    absent(dead, "a killed leaderboard's build folder is left")


def leaderboard_while_a_run_is_writing(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)
    board = folder / "board"
    succeeded(leaderboard(ws, [run], board))
    before = snapshot(board)
    hold = folder / "HOLD"
    hold.write_text("")
    holder = ws.start("-c", "import sys, time, pathlib\nfrom cmbench.lock import RunLock\n"
                      "with RunLock(pathlib.Path(sys.argv[1])):\n    pathlib.Path(sys.argv[2]).write_text('held')\n"
                      "    while pathlib.Path(sys.argv[2]).exists(): time.sleep(0.05)\n",
                      str(run / "records.jsonl"), str(hold))
    try:
        wait_for(lambda: hold.read_text() == "held", holder, 120, "the run's lock was taken")
        done = leaderboard(ws, [run], board)
    finally:
        hold.unlink()
        holder.wait(timeout=60)
    refused(done, str(run), "still writing")
    unchanged(board, before, "the previous leaderboard")


def refused_leaderboard_keeps_the_previous_board(ws: Workspace, folder: Path) -> None:
    full = copy_run(ws, folder)
    board = folder / "board"
    succeeded(leaderboard(ws, [full], board))
    before = snapshot(board)
    subset = copy_run(ws, folder, label="other")
    rows = records(subset)
    (subset / "records.jsonl").write_text(json.dumps(rows[0]) + "\n")  # another task set
    done = leaderboard(ws, [full, subset], board)
    refused(done, "leaderboard.allow_mixed=true")
    unchanged(board, before, "the previous leaderboard")


def sweep_board_covers_the_sweeps_tasks(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder)  # a streaming run of 2 tasks; the sweep runs one of them
    task = records(run)[0]["task_id"]
    done = ws.cmbench("run", "-m", "method=fullkv,streaming", f"task_ids=[{task}]", f"out_dir={folder / 'runs'}",
                      "progress=false", *ws.suite_overrides)
    succeeded(done)
    boards = sorted((folder / "runs" / "miniworld" / "leaderboard" / "sweeps").glob("*/leaderboard.csv"))
    if len(boards) != 1:
        raise ProbeFailed(f"the sweep wrote {len(boards)} boards under <leaderboard.out>/sweeps/, not one")
    board = boards[0].read_text().splitlines()
    header = board[0].split(",")
    counts = {row.split(",")[0]: row.split(",")[header.index("n_tasks")] for row in board[1:]}
    if counts != {"fullkv": "1", "streaming": "1"}:
        raise ProbeFailed(f"the sweep's board counts tasks {counts}, not one each")


# ---------------------------------------------------------------- bad input


def bad_knob(key: str, value: str, method: str = "streaming", names: tuple[str, ...] = ()):
    """A probe: ``run key=value`` is refused in one line naming it (or ``names``) and what is expected, and
    leaves no run."""

    def attack(ws: Workspace, folder: Path) -> None:
        out = folder / "runs"
        done = ws.cmbench("run", f"method={method}", f"{key}={value}", "limit=1", f"out_dir={out}", *ws.suite_overrides)
        refused(done, *(names or (f"{key}={value}",)), "expected")
        if out.exists() and any(out.rglob("records*.jsonl")):
            raise ProbeFailed(f"{key}={value} left a run behind")

    return attack


def records_are_strict_json(ws: Workspace, folder: Path) -> None:
    def refuse(constant: str) -> None:
        raise ProbeFailed(f"a record holds the non-standard JSON literal {constant}")

    for line in (base_run(ws) / "records.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def report_reads_a_bounded_part_of_a_huge_video(ws: Workspace, folder: Path) -> None:
    """A continuation whose Matroska header claims 16 million frames (a 30 KB file)."""
    run = copy_run(ws, folder)
    video = run / records(run)[0]["video"]
    data = bytearray(video.read_bytes())
    at = data.find(b"\x44\x89\x88")  # Segment Info's Duration, an 8-byte float
    if at < 0:
        raise ProbeFailed("no 8-byte Duration element in the run's mkv: the probe cannot build its input")
    (duration,) = struct.unpack(">d", data[at + 3: at + 11])
    data[at + 3: at + 11] = struct.pack(">d", duration * 1_000_000)
    video.write_bytes(bytes(data))
    done = ws.cmbench("report", f"runs=[{run}]", f"report.out={folder / 'report'}", measure=True)
    no_traceback(done)
    if done.peak_bytes is not None and done.peak_bytes > 3 * 2**30:
        raise ProbeFailed(f"report peaked at {done.peak_bytes / 2**30:.1f} GiB on a 30 KB video")


def suite_copy(ws: Workspace, folder: Path) -> tuple[Path, list[str]]:
    """The small suite's videos copied into ``folder / "data"`` (an official-layout dataset) and its
    manifest's lines (not written: the probe writes its own)."""
    base_run(ws)
    root = folder / "data"
    shutil.copytree(ws.root / "suite" / "videos", root / "videos")
    return root, (ws.root / "suite" / "metadata.jsonl").read_text().splitlines()


def validate_row(change, *names: str):
    """A probe: the small suite's manifest with its first row changed by ``change(row, folder) -> line``;
    ``validate`` must name ``metadata.jsonl:<line>`` and ``names`` in one line, without a traceback."""

    def attack(ws: Workspace, folder: Path) -> None:
        root, lines = suite_copy(ws, folder)
        lines.append(change(json.loads(lines[0]), folder))
        (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
        done = ws.cmbench("validate", "data=cmbench", f"data.root={root}", "data.check_counts=false")
        refused(done, f"metadata.jsonl:{len(lines)}", *names)
        others = set(re.findall(r"metadata\.jsonl:(\d+)", done.stderr)) - {str(len(lines))}
        if others:
            raise ProbeFailed(f"validate also reports line(s) {', '.join(sorted(others))}, which the probe left alone")

    return attack


def nul_in_video(row: dict, folder: Path) -> str:
    return json.dumps({**row, "task_id": "syn_009_reappear_01", "video": "videos/synthetic/a\u0000b.mp4"})


def long_video_path(row: dict, folder: Path) -> str:
    return json.dumps({**row, "task_id": "syn_009_reappear_01", "video": "videos/" + "a" * 5000 + ".mp4"})


def long_path_components(row: dict, folder: Path) -> str:
    return json.dumps({**row, "task_id": "syn_009_reappear_01", "video": "videos/" + "/".join(["b" * 250] * 4) + ".mp4"})


def deep_nesting(row: dict, folder: Path) -> str:
    return json.dumps({**row, "task_id": "syn_009_reappear_01"})[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"


def huge_timestamp(row: dict, folder: Path) -> str:
    text = json.dumps({**row, "task_id": "syn_009_reappear_01"})
    return re.sub(r'"timestamp_seconds": [0-9.eE+-]+', '"timestamp_seconds": 1' + "0" * 400, text, count=1)


def long_integer(row: dict, folder: Path) -> str:
    return json.dumps({**row, "task_id": "syn_009_reappear_01"})[:-1] + ', "extra": ' + "7" * 5000 + "}"


def validate_counts_only_valid_rows(ws: Workspace, folder: Path) -> None:
    root, lines = suite_copy(ws, folder)
    row = json.loads(lines[0])
    lines[0] = json.dumps({**row, "video": "videos/synthetic/missing.mp4"})
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    done = ws.cmbench("validate", "data=cmbench", f"data.root={root}", "data.check_counts=false")
    no_traceback(done)
    counted = re.findall(r"(\d+) valid task", done.stdout + done.stderr)
    if counted != [str(len(lines) - 1)]:
        raise ProbeFailed(f"validate counts {counted or 'no'} valid task(s) of {len(lines)} rows, one of them bad")


def read_only(command: str):
    """A probe: ``command`` writing into a read-only folder is one line naming it, without a traceback."""

    def attack(ws: Workspace, folder: Path) -> None:
        run = base_run(ws)
        target = folder / "ro"
        target.mkdir()
        if command == "run":
            args = ["run", "method=streaming", "limit=1", f"out_dir={target}", *ws.suite_overrides]
        elif command == "leaderboard":
            args = ["leaderboard", f"runs=[{run}]", f"leaderboard.out={target / 'board'}"]
        else:
            args = ["report", f"runs=[{run}]", f"report.out={target / 'report'}"]
        refused(ws.cmbench(*args, read_only=target), str(target))

    return attack


def backbone_without_a_name(ws: Workspace, folder: Path) -> None:
    tiny = (REPO / "configs" / "backbone" / "tiny.yaml").read_text()
    configs = config_folder(folder, {"backbone/noname.yaml": re.sub(r"(?m)^name: .*\n", "", tiny)})
    done = ws.cmbench("plan", "backbone=noname", "method=streaming", *ws.suite_overrides,
                      env=ws.env(CMBENCH_CONFIG_PATH=str(configs)))
    no_traceback(done)
    if done.returncode != 0:
        refused(done, "name")


def malformed_yaml_in_a_config_folder(ws: Workspace, folder: Path) -> None:
    configs = config_folder(folder, {"method/broken.yaml": "name: broken\nknobs: [unclosed\n"})
    done = ws.cmbench("ls", "method", env=ws.env(CMBENCH_CONFIG_PATH=str(configs)))
    refused(done, "broken.yaml")
    contains(done.stdout, "decoprune", "ls lists the other methods")


def config_folder_with_a_comma(ws: Workspace, folder: Path) -> None:
    configs = config_folder(folder / "a,b", {"method/mine.yaml": "name: mine\n_target_: cmbench.methods.fullkv.FullKV\n"})
    done = ws.cmbench("run", "method=mine", "limit=1", f"out_dir={folder / 'runs'}", *ws.suite_overrides,
                      env=ws.env(CMBENCH_CONFIG_PATH=str(configs)))
    refused(done, str(configs), "','")


def leaderboard_writes_labels_as_text(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder, label=HOSTILE_LABEL)
    done = leaderboard(ws, [run], folder / "board")
    succeeded(done)
    text = (folder / "board" / "leaderboard.md").read_text()
    lacks(text, "<script>", "leaderboard.md")
    row = next((line for line in text.splitlines() if "alert(1)" in line), None)
    if row is None or "\\|" not in row:
        raise ProbeFailed("leaderboard.md does not show the label with its '|' escaped")


def report_writes_labels_as_text(ws: Workspace, folder: Path) -> None:
    run = copy_run(ws, folder, label=HOSTILE_LABEL)
    succeeded(report(ws, [run], folder / "report"))
    page = (folder / "report" / "index.html").read_text()
    lacks(page, "<script>alert(1)", "the report page")
    contains(page, "&lt;script&gt;alert(1)", "the report page shows the label as text")


def report_counts_the_losses_it_shows(ws: Workspace, folder: Path) -> None:
    full = copy_run(ws, folder, label="fullkv")
    other = copy_run(ws, folder, label="mine")
    rows = records(other)
    for row in rows:
        row["score"] = max(0.0, (row["score"] or 0.0) - 0.1)
    (other / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    succeeded(report(ws, [full, other], folder / "report"))
    page = (folder / "report" / "index.html").read_text()
    said = re.findall(r"The (\d+) tasks? with the largest", page)
    if not said or any(n != str(len(rows)) for n in said):
        raise ProbeFailed(f"the losses list says {said or 'nothing'} for {len(rows)} paired tasks")


def score_warns_about_lossy_copies(ws: Workspace, folder: Path) -> None:
    run = base_run(ws)
    mp4 = folder / "mp4"
    mp4.mkdir()
    for video in (run / "videos").glob("*.mp4"):
        shutil.copy(video, mp4 / video.name)
    done = score(ws, mp4, folder / "scores")
    no_traceback(done)
    contains(done.stderr, "lossy", "score's warnings")


def evaluate_with_a_method_given_as_a_dict(ws: Workspace, folder: Path) -> None:
    run = base_run(ws)
    task = records(run)[0]["task_id"]
    code = ("import cmbench, sys\n"
            "r = cmbench.evaluate(method={'_target_': 'key_norm.KeyNorm', 'k': 32}, "
            f"task_ids=[{task!r}], out_dir={str(folder / 'runs')!r}, overrides={ws.suite_overrides + ['progress=false']!r})\n"
            "print('tasks ok', r.summary['tasks_ok'])\n")
    done = ws.python("-c", code, env=ws.env(pythonpath=str(REPO / "examples" / "my_method")))
    succeeded(done)
    contains(done.stdout, "tasks ok 1", "evaluate's result")


def plan_says_which_context_it_planned(ws: Workspace, folder: Path) -> None:
    done = ws.cmbench("plan", "backbone=lingbot_world_v2_14b", "method=decoprune")
    no_traceback(done)
    first = (done.stdout.strip().splitlines() or [""])[0]
    seconds = re.search(r"(\d+) s context", first)
    if seconds is None or (int(seconds.group(1)) < 60 and "MiniWorld" not in first):
        raise ProbeFailed(f"plan's first line does not say it planned a real backbone's own context: {first[:160]!r}")


def calibrate_shows_progress_and_a_runnable_line(ws: Workspace, folder: Path) -> None:
    done = ws.cmbench("calibrate", "method=streaming", "target_pr=0.9", "calibration.tasks=1",
                      "calibration.max_probes=2", f"out_dir={folder / 'runs'}", *ws.suite_overrides)
    succeeded(done)
    output = done.stdout + done.stderr
    if not re.search(r"probe 1: task 1/1", output):
        raise ProbeFailed("calibrate shows no progress inside its probe")
    line = next((x for x in done.stdout.splitlines() if " -m cmbench run " in x), "")
    if sys.executable not in line:
        raise ProbeFailed(f"calibrate's run line does not use the interpreter that ran it: {line.strip()[:160]!r}")


PROBES = [
    Probe("report-imports-no-adapter-a-run-folder-names", report_imports_no_adapter_a_run_folder_names),
    Probe("leaderboard-imports-no-adapter-a-run-folder-names", leaderboard_imports_no_adapter_a_run_folder_names),
    Probe("resumed-run-imports-no-adapter-its-folder-names", resumed_run_imports_no_adapter_its_folder_names),
    Probe("report-runs-no-standard-module-a-run-folder-names", report_runs_no_standard_module_a_run_folder_names),
    Probe("config-backbone-target-os-system", config_group_target_os_system("backbone", "'os.system' is not a Backbone")),
    Probe("config-method-target-os-system", config_group_target_os_system("method", "'os.system' is not a subclass")),
    Probe("score-writes-through-no-link-in-its-output-folder", score_writes_through_no_link_in_its_output_folder),
    Probe("run-writes-through-no-link-in-its-folder", run_writes_through_no_link_in_its_folder),
    Probe("score-over-a-finished-run-folder", score_over_a_finished_run_folder),
    Probe("report-shows-no-video-outside-its-run", report_shows_no_video_outside_its_run),
    Probe("report-out-over-a-users-folder", report_out_over_a_users_folder),
    Probe("killed-rescore-keeps-the-earlier-records", killed_rescore_keeps_the_earlier_records),
    Probe("leaderboard-empty-curves-file", empty_curves_file),
    Probe("leaderboard-torn-curves-file", torn_curves_file),
    Probe("report-torn-curves-file", report_with_a_torn_curves_file),
    Probe("killed-report-keeps-the-previous-page", killed_report_keeps_the_previous_page),
    Probe("killed-leaderboards-build-folder-is-cleaned", killed_leaderboards_build_folders_are_cleaned),
    Probe("leaderboard-while-a-run-is-writing", leaderboard_while_a_run_is_writing),
    Probe("refused-leaderboard-keeps-the-previous-board", refused_leaderboard_keeps_the_previous_board),
    Probe("sweep-board-covers-the-sweeps-tasks", sweep_board_covers_the_sweeps_tasks),
    Probe("knob-nan-method-gamma", bad_knob("method.gamma", "nan", method="decoprune")),
    Probe("knob-nan-reindex-virtual-length", bad_knob("generation.reindex_virtual_length", "nan")),
    Probe("knob-negative-reindex-recent", bad_knob("generation.reindex_recent", "-1")),
    Probe("knob-zero-reindex-virtual-length", bad_knob("generation.reindex_virtual_length", "0")),
    Probe("knob-inf-scorer-threshold", bad_knob("scorer.detector.score_threshold", "inf")),
    Probe("knob-zero-data-fps", bad_knob("data.fps", "0")),
    Probe("knob-text-keep-counts", bad_knob("method.keep_counts", "abc", method="random",
                                                  names=("keep_counts='abc'",))),
    Probe("records-are-strict-json", records_are_strict_json),
    Probe("report-huge-frame-count-header", report_reads_a_bounded_part_of_a_huge_video),
    Probe("validate-nul-byte-in-video", validate_row(nul_in_video, "video")),
    Probe("validate-5000-character-path", validate_row(long_video_path, "video")),
    Probe("validate-250-character-path-components", validate_row(long_path_components, "video")),
    Probe("validate-100k-deep-json", validate_row(deep_nesting)),
    Probe("validate-timestamp-10-to-the-400", validate_row(huge_timestamp)),
    Probe("validate-5000-digit-integer", validate_row(long_integer)),
    Probe("validate-counts-only-valid-rows", validate_counts_only_valid_rows),
    Probe("run-into-a-read-only-folder", read_only("run")),
    Probe("leaderboard-into-a-read-only-folder", read_only("leaderboard")),
    Probe("report-into-a-read-only-folder", read_only("report")),
    Probe("backbone-config-without-a-name", backbone_without_a_name),
    Probe("malformed-yaml-in-a-config-folder", malformed_yaml_in_a_config_folder),
    Probe("config-folder-path-with-a-comma", config_folder_with_a_comma),
    Probe("leaderboard-markdown-label-markup", leaderboard_writes_labels_as_text),
    Probe("report-label-markup", report_writes_labels_as_text),
    Probe("report-losses-list-count", report_counts_the_losses_it_shows),
    Probe("score-lossy-mp4-copies-warned", score_warns_about_lossy_copies),
    Probe("evaluate-method-as-dict-with-target", evaluate_with_a_method_given_as_a_dict),
    Probe("plan-real-backbone-names-its-context", plan_says_which_context_it_planned),
    Probe("calibrate-progress-and-run-line-interpreter", calibrate_shows_progress_and_a_runnable_line),
]
