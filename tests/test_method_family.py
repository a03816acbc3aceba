"""A method declares its family of KV compression: every built-in declares one, every run record carries it
(with ``+ quantization`` in a quantized storage format), and the board and the families figure read it from the
records, so a plug-in method keeps its family and so does a relabelled run."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

import cmbench
from cmbench.errors import ConfigError
from cmbench.method_family import DECLARED, RECORDED, run_family
from cmbench.methods import method_class, method_names
from cmbench.methods.base import Method
from cmbench.report import families
from cmbench.report.leaderboard import write_reports
from cmbench.runs.records import TaskRecord
from test_run_command import SMALL_SUITE
from test_tiny_backbone import random_model

BUILT_IN = {"decoprune": "eviction", "decoprune_hs": "eviction", "decoprune_reverse": "eviction",
            "random": "eviction", "streaming": "eviction", "tempdiff": "eviction", "forcingkv": "eviction",
            "dummyforcing": "eviction", "kvpress": "eviction", "worldkv": "retrieval",
            "worldkv_fixed_window": "retrieval", "key_retrieval": "retrieval", "tempcache": "merging",
            "tempcache_samepos": "merging", "fullkv": "none"}


def test_every_registered_method_declares_its_family():
    for name in method_names():
        assert method_class(name).family in DECLARED, name
    for name, family in BUILT_IN.items():
        assert method_class(name).family == family, name


@pytest.mark.parametrize("declared, storage, recorded", [
    ("eviction", "fp", "eviction"), ("eviction", "kivi", "eviction + quantization"),
    ("merging", "qvg", "merging + quantization"), ("none", "fp", "reference"), ("none", "kivi", "quantization"),
    ("", "fp", "other"), ("low-rank", "fp", "low-rank"),
    # low-rank keys are their own family, not quantization, alone and under a method
    ("none", "lowrank", "low-rank"), ("eviction", "lowrank", "eviction + low-rank"), ("low-rank", "lowrank", "low-rank"),
    ("none", "chunkmean", "quantization"),
])
def test_a_run_records_its_methods_family_and_its_storage(declared, storage, recorded):
    assert run_family(declared, storage) == recorded
    assert recorded in RECORDED


def test_every_storage_format_adds_a_family_and_an_unknown_one_is_refused():
    from cmbench.cache.quantized import FORMATS
    from cmbench.method_family import STORAGE_FAMILY

    assert set(STORAGE_FAMILY) == set(FORMATS)
    with pytest.raises(ValueError, match="storage format 'zip' is not one of"):
        run_family("eviction", "zip")


@pytest.mark.parametrize("label, expected", [
    ("fullkv+lowrank16-r0", "low-rank"), ("decoprune@bytes15+lowrank24-r0", "eviction + low-rank"),
    ("fullkv+qvg2x1k16-g32-r0", "quantization"), ("decoprune@bytes15+kivi4-g32-r128", "eviction + quantization"),
    ("fullkv", "reference"), ("streaming+gzip9", "other"),
])
def test_a_board_without_a_family_column_reads_the_family_from_the_label(label, expected):
    assert families.family(label) == expected


@dataclass
class Undecided(Method):
    name = "undecided_family"
    family = "compression"


def test_a_family_outside_the_vocabulary_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        Undecided()
    assert str(err.value) == ("method 'undecided_family': family 'compression' is not one of eviction, retrieval, "
                              "merging, low-rank, none")


def test_a_record_with_an_unknown_family_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^family: is 'magic', expected one of "):
        TaskRecord(task_id="t", status="ok", family="magic")
    assert TaskRecord.from_json({"task_id": "t", "status": "ok", "family": "merging"}).family == "merging"


@dataclass
class MergesEverything(Method):
    """A user's method (not registered, defined in a test module) that declares itself a merging method."""

    name = ""
    family = "merging"


def test_the_board_reads_the_family_the_records_carry(tmp_path):
    """A plug-in's declared family and a relabelled built-in's both reach the board and the figure's reading;
    the label alone names neither (``other``)."""
    weights = tmp_path / "tiny.safetensors"
    random_model(seed=3).save_pretrained(weights)
    overrides = [f"data.root={tmp_path / 'suite'}", *SMALL_SUITE, f"backbone.path={weights}"]
    runs = tmp_path / "runs"
    plugin = cmbench.evaluate(method=MergesEverything(), limit=1, out_dir=runs, overrides=overrides)
    relabelled = cmbench.evaluate(method="streaming", limit=1, out_dir=runs, label="my_entry",
                                  overrides=[*overrides, "storage=kivi"])
    assert plugin.records.loc[0, "family"] == "merging"
    assert relabelled.records.loc[0, "family"] == "eviction + quantization"
    written = write_reports([plugin.run_dir, relabelled.run_dir], tmp_path / "board")
    board = pd.read_csv(written["leaderboard.csv"])
    assert dict(zip(board["method"], board["family"])) == {"mergeseverything": "merging",
                                                          "my_entry": "eviction + quantization"}
    read = families.read_board(written["leaderboard.csv"])
    assert dict(zip(read["method"], read["family"])) == {"mergeseverything": "merging",
                                                        "my_entry": "eviction + quantization"}
    assert families.family("my_entry") == families.family("mergeseverything") == "other"  # what the label says


def test_a_board_without_the_column_falls_back_to_the_registered_methods_family(tmp_path):
    """Boards written before records carried the family: the family the label's registered method declares."""
    board = pd.DataFrame({"method": ["fullkv", "tempcache@bytes15", "x"], "family": [None, None, "retrieval"]})
    assert families.entry_families(board) == ["reference", "merging", "retrieval"]
    assert families.entry_families(board.drop(columns="family")) == ["reference", "merging", "other"]
