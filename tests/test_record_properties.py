"""Task records (hypothesis): any valid record survives JSON and a records file unchanged (write -> read
gives the same record), and any bytes in a records file either read as records or raise a one-line
``RecordsError`` naming the file and line, never another exception."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmbench.runs.records import KINDS, STATUSES, RecordsError, RecordWriter, TaskRecord, read_records_file, read_task_records

finite = st.floats(allow_nan=False, allow_infinity=False)
fraction = st.floats(0.0, 1.0)
non_negative = st.floats(0.0, 1e12)
text = st.text(max_size=30)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | finite | text,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=10)


@st.composite
def records(draw) -> TaskRecord:
    n_frames = draw(st.none() | st.integers(1, 500))
    frame = st.integers(0, (n_frames or 500) - 1)
    n_refs = draw(st.integers(0, 3))
    fields = {
        "task_id": draw(st.text(min_size=1, max_size=40)),
        "status": draw(st.sampled_from(STATUSES)),
        "kind": draw(st.sampled_from(KINDS)),
        "label": draw(st.none() | text),
        "seed": draw(st.none() | st.integers(-2**63, 2**63 - 1)),
        "error": draw(st.none() | text),
        "score": draw(st.none() | st.floats(-1.0, 1.0)),
        "similarities": draw(st.none() | st.lists(st.none() | st.floats(-1.0, 1.0), max_size=6)),
        "boxes": draw(st.none() | st.lists(st.none() | st.lists(fraction, min_size=4, max_size=4), max_size=4)),
        "reference_scores": draw(st.just([0.5] * n_refs) if n_refs else st.none()),
        "reference_best_frames": draw(st.lists(st.none() | frame, min_size=n_refs, max_size=n_refs)) if n_refs else None,
        "reference_aggregation": draw(st.none() | st.sampled_from(["mean", "max"])),
        "best_frame": draw(st.none() | frame),
        "n_frames": n_frames,
        "method_config": draw(st.none() | st.dictionaries(text, json_values, max_size=4)),
        "versions": draw(st.none() | st.dictionaries(text, text, max_size=3)),
        "pr": draw(st.none() | fraction),
        "context_pr": draw(st.none() | fraction),
        "kept_tokens": draw(st.none() | st.integers(0, 10**15)),
        "peak_kv_bytes": draw(st.none() | st.integers(0, 10**15)),
        "continuation_seconds": draw(st.none() | non_negative),
        "run_seed": draw(st.none() | st.integers(0, 2**63 - 1)),
    }
    return TaskRecord(**fields)


@settings(max_examples=60, deadline=None)
@given(records())
def test_a_record_survives_json_unchanged(record):
    line = json.dumps(record.to_json(), sort_keys=True, allow_nan=False)  # strict JSON: no NaN literal
    assert TaskRecord.from_json(json.loads(line)) == record


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=4))
def test_written_records_read_back_the_same_in_order(batch):
    with tempfile.TemporaryDirectory() as folder:
        writer = RecordWriter(Path(folder) / "records.jsonl")
        written = [writer.write(r) for r in batch]
        assert [dataclasses.replace(w, recorded_ns=None) for w in written] == batch
        assert [w.recorded_ns for w in written] == sorted({w.recorded_ns for w in written})  # strictly increasing
        assert read_task_records(folder) == written
        assert RecordWriter(Path(folder) / "records.jsonl").write(batch[0]).recorded_ns > written[-1].recorded_ns


hostile_lines = st.one_of(
    st.binary(max_size=60),
    st.text(max_size=60).map(str.encode),
    st.just(b"[" * 10**5 + b"]" * 10**5),  # deeper than Python parses
    st.integers(4400, 6000).map(lambda n: ('{"task_id": "t", "status": "ok", "seed": 1' + "0" * n + "}").encode()),
    st.builds(lambda r, extra: json.dumps({**r.to_json(), **extra}).encode(), records(),
              st.dictionaries(st.sampled_from(["score", "status", "pr", "best_frame", "task_id", "n_frames", "zzz"]),
                              json_values, max_size=2)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_lines, min_size=1, max_size=4))
def test_any_records_file_reads_or_names_its_bad_line(lines):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "records.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
        try:
            read = read_records_file(path)
        except RecordsError as err:
            message = str(err)
            assert message.startswith(f"{path}:") and "\n" not in message and len(message) < 2000, message
            number = int(message[len(str(path)) + 1:].split(":", 1)[0])
            assert 1 <= number <= len(lines)
        else:
            assert all(isinstance(r, TaskRecord) and 1 <= n <= len(lines) for r, n in read)
