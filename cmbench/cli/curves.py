"""``python -m cmbench curves methods=[decoprune,random] target_prs=[0.75,0.8,0.85,0.9,0.95]``.

For every method and target PR: calibrate the method's own knob on calibration contexts
(:func:`cmbench.calibration.matched_pr.calibrate_method`, reused when done before), then run it on
the test suite with the found knob through the normal ``run`` machinery (resumable; label
``<method>@pr<t>``; run directories under ``<out_dir>/curves/<data>/`` so they stay off the default
leaderboard), and FullKV once (under ``<out_dir>/<data>/``, shared with the reference runs). Then, in
the leaderboard folder (``leaderboard.out``, default ``<out_dir>/<data>/leaderboard``): ``curves.csv``,
``auc.csv`` and ``curves.png`` (:mod:`cmbench.report.curves`), and, when the records carry quality
metrics, ``curves_reference.csv`` (FullKV's row), ``quality_vs_memory.png`` (memory and quality against
PR, normalised to FullKV) and ``quality_vs_memory.csv`` (each metric's range over PR 0.75..0.95). ``limit=N`` and the other selection
knobs pass through to the runs. A target a method's knob cannot reach on the calibration contexts is a
gap in its curve: a row with the reason in ``note`` and no numbers, said on stderr. Methods default to every registered method that declares a knob.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from cmbench.calibration.matched_pr import calibrate_method, calibration_options, method_knob
from cmbench.cli.calibrate import describe, progress, target_of
from cmbench.config_paths import config_dirs, editable_copy, to_dict
from cmbench.errors import ConfigError
from cmbench.runs.progress import _duration as duration

CURVES_DIR = "curves"


def method_option(cfg: DictConfig, name: str) -> DictConfig:
    """``cfg`` with its ``method`` group set to the option ``name`` (``method/<name>.yaml`` of the config
    folders, the last folder that has it winning), as ``method=<name>`` would compose it."""
    found = [d / "method" / f"{name}.yaml" for d in config_dirs() if (d / "method" / f"{name}.yaml").is_file()]
    if not found:
        from cmbench.registry import did_you_mean

        options = sorted({p.stem for d in config_dirs() for p in (d / "method").glob("*.yaml")})
        raise ConfigError(f"methods: no method config {name!r}.{did_you_mean(name, options)}")
    out = editable_copy(cfg)
    option = OmegaConf.load(found[-1])
    with open_dict(out):
        out.method = option
        if not out.method.get("name"):
            out.method.name = name
    return out


def curve_methods(cfg: DictConfig) -> list[str]:
    """``methods`` (a list or one name), default every registered method with a knob."""
    from cmbench.methods.registry import method_class, method_names

    value = cfg.get("methods")
    if value is None:
        return [n for n in method_names() if method_class(n).knob is not None]
    if isinstance(value, str):
        return [value]
    if isinstance(value, ListConfig) and value and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"methods={value!r}: expected a list of method names, e.g. methods=[decoprune,random]")


def curve_targets(cfg: DictConfig) -> list[float]:
    value = cfg.get("target_prs")
    if not isinstance(value, ListConfig) or not value:
        raise ConfigError(f"target_prs={value!r}: expected a list of pruning ratios, e.g. target_prs=[0.8,0.85,0.9]")
    return sorted({target_of(v, "target_prs") for v in value})


def _board_row(run_dir: Path) -> dict[str, Any]:
    from cmbench.report.leaderboard import leaderboard, load_runs

    return leaderboard(load_runs([run_dir])).iloc[0].to_dict()


def say_waiting(run_dir: Path, holder: str) -> None:
    """Say that a run the curves need is being written by another process, which they now wait for."""
    print(f"curves: waiting for {holder}, which is writing {run_dir.name} (a run these curves share with "
          f"another command, e.g. FullKV's with a second curves lane); its finished tasks are then reused",
          file=sys.stderr, flush=True)


def _run(cfg: DictConfig) -> Path:
    from cmbench.cli.run import code_messages
    from cmbench.runs.experiment import run_experiment
    from cmbench.spec import resolve_run

    spec = resolve_run(cfg)
    # another lane writing the same run (FullKV's, or a point two curves share) is waited for, not refused
    done = run_experiment(spec, on_lock_wait=lambda holder: say_waiting(spec.outputs.run_dir, holder))
    for line in code_messages(done):
        print(line)
    s = done.summary
    pr, score = ("-" if s[k] is None else f"{s[k]:.4f}" for k in ("pr", "score"))
    print(f"{done.label}: {s['tasks_ok']}/{s['tasks_expected']} tasks ok, PR {pr}, score {score}; {done.run_dir}")
    if s["tasks_failed"]:
        raise ConfigError(f"{done.label}: {s['tasks_failed']} task(s) failed (reasons in {done.run_dir}/records.jsonl)")
    return done.run_dir


def execute(cfg: DictConfig) -> int:

    from cmbench.report.curves import (
        AREA_FILE,
        CURVES_FILE,
        PLOT_FILE,
        board_point,
        curve_table,
        quality_columns,
        write_curves,
    )
    from cmbench.report.board_folder import CURVE_FILES, board_folder
    from cmbench.report.leaderboard import REFERENCE_METHOD
    from cmbench.spec import data_dir

    names, targets, options = curve_methods(cfg), curve_targets(cfg), calibration_options(cfg)
    configs = {name: method_option(cfg, name) for name in names}
    for mcfg in configs.values():  # refuse a method without a knob before any work
        method_knob(to_dict(mcfg.method))
    out = Path(str(cfg.leaderboard.out or data_dir(cfg) / "leaderboard"))
    board = board_folder(out, CURVE_FILES)  # a folder of the user's, or another kind's, is refused before any work
    rows: list[dict[str, Any]] = []
    points, began = len(configs) * len(targets), time.monotonic()
    for name, mcfg in configs.items():
        for target in targets:
            done = len(rows)
            eta = f", ~{duration((time.monotonic() - began) / done * (points - done))} left" if done else ""
            print(f"[{done + 1}/{points}{eta}] calibrating {name} to PR {target:.4f}, then running it", flush=True)
            shown = progress(mcfg, int(options["max_probes"]))
            try:
                cal = calibrate_method(mcfg, target, **options, on_probe=shown.probe,  # type: ignore[arg-type]
                                       on_task=shown.task)
            except ConfigError as err:  # e.g. a target the knob's range cannot reach: a gap in the curve, said
                print(f"{name}: no point at PR {target:.4f}: {err}", file=sys.stderr)
                rows.append({"method": name, "target_pr": target, "note": str(err)})
                continue
            for line in describe(cal):
                print(line)
            run_cfg = editable_copy(mcfg)
            with open_dict(run_cfg):
                run_cfg.method[cal.knob] = cal.value
                run_cfg.label = cal.label
                run_cfg.out_dir = str(Path(str(cfg.out_dir)) / CURVES_DIR)
            run_dir = _run(run_cfg)
            rows.append({"method": name, "target_pr": target, "knob": cal.knob, "knob_value": cal.value,
                         "calibration_pr": cal.calibration_pr, **board_point(_board_row(run_dir)),
                         "label": cal.label, "run_dir": str(run_dir), "note": cal.note})
    reference_dir = _run(method_option(cfg, "fullkv"))
    reference = _board_row(reference_dir)
    curves = curve_table(rows)
    board.add(*(CURVE_FILES if quality_columns(curves) else CURVE_FILES[:3]))  # the quality files when written
    areas = write_curves(curves, out, (reference["score"], reference["score_ci95"]), metric=str(reference["metric"]))
    print(curves.drop(columns=["run_dir", "note"]).to_string(index=False, float_format="%.4f"))
    print(areas.to_string(index=False, float_format="%.4f"))
    written = [CURVES_FILE, AREA_FILE, PLOT_FILE]
    if quality_columns(curves):
        written += write_quality_vs_memory(curves, {"method": REFERENCE_METHOD, **board_point(reference),
                                                    "label": REFERENCE_METHOD, "run_dir": str(reference_dir)},
                                           str(reference["metric"]), out)
    print(f"wrote {', '.join(written)} to {out}")
    return 0


def write_quality_vs_memory(curves, reference: dict[str, Any], metric: str, out: Path,
                            title: str | None = None) -> list[str]:
    """Write FullKV's row, the quality-vs-memory figure and table beside ``curves.csv``; print the table.

    Returns the names of the files written.
    """
    from cmbench.report.curves import (
        QUALITY_PLOT_FILE,
        QUALITY_TABLE_FILE,
        REFERENCE_FILE,
        curve_table,
        normalised_points,
        quality_vs_memory_plot,
        quality_vs_memory_table,
    )

    from cmbench.runs import atomic

    reference_row = curve_table([reference])
    atomic.write_with(out / REFERENCE_FILE, lambda tmp: reference_row.to_csv(tmp, index=False, float_format="%.6g"))
    points = normalised_points(curves, reference, memory=metric)
    atomic.write_with(out / QUALITY_PLOT_FILE, lambda tmp: quality_vs_memory_plot(
        points, tmp, title or f"{metric} and quality vs PR, relative to FullKV (95% CI bands)"))
    table = quality_vs_memory_table(points)
    atomic.write_with(out / QUALITY_TABLE_FILE, lambda tmp: table.to_csv(tmp, index=False, float_format="%.6g"))
    print(table.to_string(index=False, float_format="%.4f"))
    return [REFERENCE_FILE, QUALITY_PLOT_FILE, QUALITY_TABLE_FILE]
