"""Named task subsets (data_manifests/subsets/): parsing, checking against a manifest, and selection."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cmbench.data import subsets
from cmbench.data.subsets import check_subset, load_subset, subsets_of
from cmbench.errors import ConfigError
from cmbench.spec import selection

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.txt"
    path.write_text(text)
    return str(path)


def test_a_subset_file_gives_its_ids_in_order_with_their_lines(tmp_path):
    subset = load_subset(write(tmp_path, "# dataset: miniworld\n# a comment\n\nsyn_002_revisit_01\nsyn_001_reappear_01\n"))
    assert subset.name == "mine" and subset.dataset == "miniworld"
    assert subset.task_ids == ("syn_002_revisit_01", "syn_001_reappear_01")
    assert subset.lines == (4, 5)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("syn_001_reappear_01\n", ":1: dataset: missing header"),
        ("# dataset: miniworld\n# dataset: cmbench\nsyn_001\n", ":2: dataset: named twice"),
        ("# dataset: miniworld\nsyn_001\n../etc/passwd\n", ":3: task_id: '../etc/passwd' is not a task id"),
        ("# dataset: miniworld\nsyn_001\nsyn_002\nsyn_001\n", ":4: task_id: syn_001 repeats line 2"),
        ("# dataset: miniworld\n\n", "the subset lists no task"),
    ],
)
def test_a_malformed_subset_is_one_line_naming_file_and_line(tmp_path, text, where):
    with pytest.raises(ConfigError) as err:
        load_subset(write(tmp_path, text))
    assert where in str(err.value) and "mine.txt" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_subset_name_lists_the_built_in_ones():
    with pytest.raises(ConfigError, match="miniworld_quick16"):
        load_subset("no_such_subset")


def test_check_subset_names_the_line_of_each_id_the_manifest_lacks(tmp_path):
    subset = load_subset(write(tmp_path, "# dataset: miniworld\nsyn_001_reappear_01\nsyn_999_revisit_01\n"))
    problems = check_subset(subset, {"syn_001_reappear_01"})
    assert [(p.line, p.field) for p in problems] == [(3, "task_id")]
    assert "syn_999_revisit_01 is not in the miniworld manifest" in str(problems[0])


def test_built_in_subsets_are_found_by_dataset():
    names = [s.name for s in subsets_of("miniworld")]
    assert "miniworld_quick16" in names and subsets_of("no_such_dataset") == []
    assert len(load_subset("miniworld_quick16").task_ids) == 16


def _cfg(**extra):
    base = {"data": {"name": "miniworld", "world_seed": 0, "dynamic": True}, "seed": 2, "limit": None, "sample_seed": 2, "task_ids": None,
            "subset": None, "threads": 1, "shard": {"count": 1, "index": 0}, "progress_every": 10}
    return OmegaConf.create({**base, **extra})


def test_subset_selects_exactly_its_tasks_and_refuses_a_clash(tmp_path):
    chosen = selection(_cfg(subset="miniworld_quick16"), "miniworld")
    assert chosen.task_ids is not None and list(chosen.task_ids) == list(load_subset("miniworld_quick16").task_ids)
    with pytest.raises(ConfigError, match="set one of them"):
        selection(_cfg(subset="miniworld_quick16", task_ids=["syn_001_reappear_01"]), "miniworld")
    with pytest.raises(ConfigError, match="lists miniworld tasks"):
        selection(_cfg(subset="miniworld_quick16"), "cmbench")


def test_a_subset_names_the_data_settings_it_was_drawn_from(tmp_path):
    subset = load_subset(write(tmp_path, "# dataset: miniworld\n# data.world_seed: 0\n# data.dynamic: true\nsyn_001\n"))
    assert subset.conditions == (("world_seed", "0"), ("dynamic", "true"))
    assert subset.mismatch({"name": "miniworld", "world_seed": 0, "dynamic": True}) is None
    assert subset.mismatch({"name": "miniworld", "world_seed": 3, "dynamic": True}) == (
        "data.world_seed=3 (its tasks come from data.world_seed=0)")
    assert subset.mismatch({"name": "miniworld", "world_seed": 0, "dynamic": False}) == (
        "data.dynamic=false (its tasks come from data.dynamic=true)")
    with pytest.raises(ConfigError, match=r":3: data.world_seed: named twice"):
        load_subset(write(tmp_path, "# dataset: miniworld\n# data.world_seed: 0\n# data.world_seed: 1\nsyn_001\n"))


def test_the_built_in_miniworld_subsets_are_the_default_worlds():
    for subset in subsets_of("miniworld"):
        data = OmegaConf.to_container(OmegaConf.load(REPO / "configs/data/miniworld.yaml"))
        assert subset.mismatch(data) is None, subset.name
        assert subset.mismatch({**data, "world_seed": 3}) is not None, subset.name


def test_a_subset_of_another_world_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"subset=miniworld_quick16 .*miniworld_quick16.txt\) lists the tasks of "
                                          r"another world: data.world_seed=3 \(its tasks come from data.world_seed=0\)"):
        selection(_cfg(subset="miniworld_quick16", data={"name": "miniworld", "world_seed": 3, "dynamic": True}),
                  "miniworld")


def test_validate_reports_a_subset_id_missing_from_the_manifest(tmp_path, monkeypatch, capsys):
    from cmbench.cli import validate

    folder = tmp_path / "subsets"
    folder.mkdir()
    (folder / "broken.txt").write_text("# dataset: miniworld\n# data.world_seed: 0\nsyn_001_reappear_01\nnot_a_task\n")
    # drawn from another world of the same dataset: not this suite's subset, so not checked against it
    (folder / "other_world.txt").write_text("# dataset: miniworld\n# data.world_seed: 3\nsyn_001_reappear_01\nonly_in_3\n")
    monkeypatch.setattr(subsets, "SUBSET_DIR", folder)
    root = tmp_path / "mw"
    from cmbench.miniworld import build_suite

    build_suite(OmegaConf.create({**OmegaConf.to_container(OmegaConf.load(REPO / "configs/data/miniworld.yaml")),
                                  "root": str(root)}))
    data = OmegaConf.load(REPO / "configs/data/miniworld.yaml")
    data.root = str(root)
    assert validate.execute(OmegaConf.create({"data": data})) == 1
    err = capsys.readouterr().err
    assert f"{folder / 'broken.txt'}:4: task_id: not_a_task is not in the miniworld manifest" in err
    assert "syn_001_reappear_01" not in err and "only_in_3" not in err and "other_world" not in err


def test_configs_and_data_manifests_are_top_level_and_the_only_copy():
    for name in ("configs", "data_manifests"):
        assert (REPO / name).is_dir() and not (REPO / "cmbench" / name).exists()
    assert (REPO / "configs" / "config.yaml").is_file()
    assert {p.stem for p in (REPO / "data_manifests").glob("*.yaml")} == {"cmbench", "miniworld"}


def test_an_unknown_subset_lists_the_built_in_ones_or_says_there_are_none(tmp_path, monkeypatch):
    from cmbench.errors import ConfigError

    folder = tmp_path / "subsets"
    folder.mkdir()
    monkeypatch.setattr(subsets, "SUBSET_DIR", folder)
    with pytest.raises(ConfigError, match=r"^task subset not found: .*nope\.txt \(built-in subsets: none\)$"):
        subsets.subset_path("nope")
    (folder / "b.txt").write_text("# dataset: miniworld\n")
    (folder / "a.txt").write_text("# dataset: miniworld\n")
    with pytest.raises(ConfigError, match=r"\(built-in subsets: a, b\)$"):
        subsets.subset_path("nope")
