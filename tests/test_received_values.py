"""Values read from folders CMBench did not write: each impossible one is refused in one line naming the
file, the row and the field (or, for a calibration log, not reused: calibrated again, saying why), never a
traceback and never accepted silently."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from cmbench.calibration.matched_pr import Calibration, _cached, log_problem
from cmbench.methods.knobs import Knob
from cmbench.report import ReportError, write_reports
from cmbench.report.reading import read_records
from cmbench.runs.records import RecordsError, read_task_records
from test_report import record


def folder_with(tmp_path, *, row: dict | None = None, line: str | None = None, files: dict[str, str] | None = None):
    """A run folder of four good records, the first changed by ``row`` (or replaced by the raw ``line``), and
    ``files`` (name -> text) beside them."""
    rows = [json.dumps(record("fullkv", t, s)) for t, s in [("a1", 0.8), ("a2", 0.6), ("b1", 0.7), ("b2", 0.5)]]
    if row is not None:
        rows[0] = json.dumps({**record("fullkv", "a1", 0.8), **row})
    if line is not None:
        rows[0] = line
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "records.jsonl").write_text("".join(r + "\n" for r in rows))
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("field, value, said", [
    ("recorded_ns", "yesterday", 'recorded_ns: is "yesterday", expected an integer'),
    ("task_type", ["reappear"], 'task_type: is ["reappear"], expected a string'),
    ("source", {"a": 1}, 'source: is {"a": 1}, expected a string'),
    ("context_id", 7, "context_id: is 7, expected a string"),
    ("code_hash", {"cmbench": "x"}, 'code_hash: is {"cmbench": "x"}, expected a string'),
    ("label", "a\ud800b", r"label: holds 'a\ud800b', a lone surrogate: not text"),
    ("seed", 2**70, "seed: is 1180591620717411303424, past the 64-bit integer range"),
    ("best_box", ["a", "b", "c", "d"], 'best_box: is ["a", "b", "c", "d"], expected a box [x0, y0, x1, y1] of 4 numbers'),
    ("best_box", [0.1], "best_box: is [0.1], expected a box"),
    ("best_box", [[1], [2], [3], [4]], "best_box: is [[1], [2], [3], [4]], expected a box"),
    ("boxes", [None, [0.1, 0.2, 0.3]], "boxes: [1] is [0.1, 0.2, 0.3], expected a box"),
    ("similarities", [0.5, "high"], 'similarities: [1] is "high", expected a number'),
])
def test_a_record_field_of_the_wrong_json_type_is_named_by_file_row_and_field(tmp_path, field, value, said):
    folder = folder_with(tmp_path, row={field: value})
    with pytest.raises(RecordsError) as err:
        read_task_records(folder)
    assert str(err.value).startswith(f"{folder / 'records.jsonl'}:1: {said}")


def test_whole_numbers_written_as_floats_and_numpy_free_json_types_still_read(tmp_path):
    folder = folder_with(tmp_path, row={"peak_kv_bytes": 1000.0, "recorded_ns": 5, "best_frame": 0, "n_frames": 2,
                                        "best_box": [0, 0.1, 1, 0.5], "boxes": [[0, 0.1, 1, 0.5], None]})
    first = next(r for r in read_task_records(folder) if r.task_id == "a1")
    assert first.peak_kv_bytes == 1000.0 and first.best_box == [0, 0.1, 1, 0.5]


def test_a_score_of_1e999_is_refused_not_shown_as_inf(tmp_path):
    folder = folder_with(tmp_path, line=json.dumps(record("fullkv", "a1", 0.8)).replace('"score": 0.8', '"score": 1e999'))
    with pytest.raises(RecordsError, match=r"records.jsonl:1: score: is inf, expected a similarity in \[-1, 1\]"):
        write_reports([folder], tmp_path / "board")
    assert not (tmp_path / "board").exists()


def test_a_lone_surrogate_in_run_json_label_is_one_line_naming_run_json(tmp_path):
    folder = folder_with(tmp_path, files={"run.json": '{"label": "a\\ud800b"}'})
    with pytest.raises(ReportError) as err:
        write_reports([folder], tmp_path / "board")
    assert str(err.value) == rf"{folder / 'run.json'}: label: holds 'a\ud800b', a lone surrogate: not text"


@pytest.mark.parametrize("name, text, said", [
    ("config.yaml", "seed: 1180591620717411303424\n", "config.yaml: seed: is 1180591620717411303424, expected an "
                                                      "integer seed in [-2**63, 2**63 - 1]"),
    ("config.yaml", "seed: abc\n", "config.yaml: seed: is abc, expected an integer seed"),
    ("run.json", '{"run_seed": 1180591620717411303424}', "run.json: run_seed: is 1180591620717411303424"),
])
def test_a_seed_no_table_can_hold_is_one_line_naming_the_file_and_key(tmp_path, name, text, said):
    folder = folder_with(tmp_path, files={name: text})
    with pytest.raises(ReportError) as err:
        read_records(folder)
    assert str(err.value).startswith(f"{folder}/{said}")


def test_a_seed_of_int64s_largest_is_read(tmp_path):
    folder = folder_with(tmp_path, files={"config.yaml": f"seed: {2**63 - 1}\n"})
    assert read_records(folder).seeds == [2**63 - 1]


# ---------------------------------------------------------------- received calibration logs

KNOB = Knob("gamma", 0.0, 4.0)


def logged(**change) -> Calibration:
    good = Calibration(method="decoprune", label="decoprune@pr90", knob="gamma", value=1.5, calibration_pr=0.9,
                       target_pr=0.9, tolerance=0.005, within_tolerance=True, note="", probes=[[1.0, 0.8], [1.5, 0.9]],
                       data={"root": "suite", "task_ids": ["t0"]}, code={}, key="k1", yaml="m.yaml", log="l.json")
    return Calibration(**{**asdict(good), **change})


@pytest.mark.parametrize("change, said", [
    ({"value": 1e308}, "value: is 1e+308, expected a number in the knob's range [0, 4]"),
    ({"value": "abc"}, 'value: is "abc", expected a number'),
    ({"value": math.nan}, "value: is NaN, expected a number"),
    ({"calibration_pr": 7.5}, "calibration_pr: is 7.5, expected a fraction in [0, 1]"),
    ({"target_pr": 1.0}, "target_pr: is 1.0, expected a fraction in [0, 1)"),
    ({"knob": "window"}, "knob: is \"window\", expected 'gamma'"),
    ({"within_tolerance": "yes"}, 'within_tolerance: is "yes", expected true or false'),
    ({"probes": [[1.0, 3.0]]}, "probes: probe 0 is [1.0, 3.0]: the value must be finite and the PR within [0, 1]"),
])
def test_an_impossible_calibration_log_is_named_by_field(change, said):
    assert log_problem(logged(**change), KNOB).startswith(said)
    assert log_problem(logged(), KNOB) is None


def test_an_impossible_log_with_the_right_key_is_not_reused_and_the_log_is_named(tmp_path, capsys):
    path = tmp_path / "decoprune_pr90.json"
    path.write_text(logged(value=1e308).to_json())
    assert _cached(path, "k1", KNOB, {}) is None
    err = capsys.readouterr().err
    assert err == (f"calibrate: calibration log {path}: value: is 1e+308, expected a number in the knob's range "
                   f"[0, 4]: not reused, calibrating again\n")
    path.write_text(logged().to_json())
    reused = _cached(path, "k1", KNOB, {})
    assert reused is not None and reused.cached and reused.value == 1.5


# ---------------------------------------------------------------- a received record's KV bytes


@pytest.mark.parametrize("row, said", [
    ({"kv_bytes_ratio": 1e308}, "kv_bytes_ratio: is 1e+308, more than the 1.0000 of FullKV's history its pr 0.0000 "
                                "keeps (+0.05 for per-row metadata)"),
    ({"kv_bytes_ratio": 50, "pr": 0.0}, "kv_bytes_ratio: is 50, more than the 1.0000 of FullKV's history"),
    ({"kv_bytes_ratio": 0.5, "pr": 0.8}, "kv_bytes_ratio: is 0.5, more than the 0.2000 of FullKV's history its pr 0.8000"),
    ({"kv_bytes_ratio": 0.5, "mean_kv_bytes": 100.0, "fullkv_kv_bytes": 400.0},
     "kv_bytes_ratio: is 0.5, but the record's own mean_kv_bytes / fullkv_kv_bytes is 0.25"),
])
def test_a_kv_bytes_ratio_its_own_pr_and_bytes_cannot_give_is_named_by_file_row_and_field(tmp_path, capsys, row, said):
    folder = folder_with(tmp_path, row=row)
    with pytest.raises(RecordsError) as err:
        write_reports([folder], tmp_path / "board")
    assert str(err.value).startswith(f"{folder / 'records.jsonl'}:1: {said}")
    assert not (tmp_path / "board").exists() and "inf%" not in capsys.readouterr().out


@pytest.mark.parametrize("row", [
    {"kv_bytes_ratio": 0.25, "pr": 0.75, "mean_kv_bytes": 100.0, "fullkv_kv_bytes": 400.0},  # eviction in fp
    {"kv_bytes_ratio": 0.0725, "pr": 0.75},  # a quantized format stores less than its PR keeps
    {"kv_bytes_ratio": 0.6023, "pr": 0.4},  # a merge's counts: a little more
    {"kv_bytes_ratio": 1.0, "pr": 0.0, "mean_kv_bytes": 3.0, "fullkv_kv_bytes": 3.0},
])
def test_a_kv_bytes_ratio_its_own_pr_and_bytes_give_is_read(tmp_path, row):
    folder = folder_with(tmp_path, row=row)
    first = next(r for r in read_task_records(folder) if r.task_id == "a1")
    assert first.kv_bytes_ratio == row["kv_bytes_ratio"]
