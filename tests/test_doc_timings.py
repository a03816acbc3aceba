"""The README's time per task is what docs/writing_a_method.md's runs printed (both written by one run of
scripts/update_doc_examples.py), not a number typed by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cmbench.doc_examples import TIMINGS_MARKERS, parse, task_seconds, timings_paragraph, with_timings

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "writing_a_method.md"


def test_the_readmes_time_per_task_is_the_guides():
    text = (REPO / "README.md").read_text()
    start, end = TIMINGS_MARKERS
    assert start in text and end in text, "README.md: the time per task is not between the timings markers"
    section = text.split(start, 1)[1].split(end, 1)[0].strip()
    measured = re.search(r"on (\d+) cores at a 15-minute load average of ([\d.]+);", " ".join(section.split()))
    assert measured is not None, section
    seconds = task_seconds([c.output for c in parse(GUIDE.read_text(), str(GUIDE)).commands])
    assert section == timings_paragraph(seconds, float(measured.group(2)), int(measured.group(1)))


def test_seconds_per_task_come_from_runs_that_computed_every_task():
    outputs = [
        "fullkv__tiny__light__0123456789: 0/2 tasks (0 cached, 0 failed), mean score -; 2 to run, 0 cached\n"
        "fullkv__tiny__light__0123456789: 2/2 tasks (0 cached, 0 failed), mean score 0.98, 4.6 s/task, 9s "
        "elapsed, ~0s left; done",
        "key_norm__tiny__light__abcdefabcd: 2/2 tasks (0 cached, 0 failed), mean score 0.7, 3.5 s/task, 7s "
        "elapsed, ~0s left; done\n"
        "decoprune__tiny__light__abcdefabcd: 1/2 tasks (1 cached, 0 failed), mean score 0.9, 9.9 s/task, 9s "
        "elapsed, ~0s left; done",  # half cached: not a measurement of every task
        "key_norm__tiny__light__abcdefabcd: 2/2 tasks (0 cached, 0 failed), mean score 0.3, 8.0 s/task, 16s "
        "elapsed, ~0s left; done",  # a later run of the same method
    ]
    assert task_seconds(outputs) == {"fullkv": 4.6, "key_norm": 3.5}
    with pytest.raises(KeyError):
        timings_paragraph(task_seconds(outputs), 1.0, 2)
    paragraph = " ".join(timings_paragraph({"fullkv": 4.6, "decoprune": 3.1}, 0.54, 2).split())
    assert "3.1 s with DeCoPrune and 4.6 s with FullKV" in paragraph and "116 tasks take roughly 6 minutes" in paragraph
    assert "on 2 cores at a 15-minute load average of 0.5;" in paragraph


def test_the_timings_section_is_replaced_whole_and_nothing_else():
    start, end = TIMINGS_MARKERS
    text = f"before\n\n{start}\nold words\n{end}\n\nafter\n"
    assert with_timings(text, "new") == f"before\n\n{start}\nnew\n{end}\n\nafter\n"
    with pytest.raises(ValueError, match="no <!-- timings -->"):
        with_timings("no section", "new")
