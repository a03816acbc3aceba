"""Calibration to a target PR by hand, without running a model: the options and method checks with their
exact words, the file names (target tags, keyed logs, probe caches), the probe cache's merging and filtering,
and :func:`calibrate_method` end to end with the calibration tasks, the code identity and the PR meter
replaced by fakes whose PR is a hand-written function of the knob (so every probe, value, note, key and
written file is known in advance); reuse of an earlier calibration, and what is (re)written when.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

import cmbench.calibration.matched_pr as matched_pr
from cmbench.calibration.matched_pr import (Calibration, calibrate_method, calibration_options, calibration_paths,
                                            calibration_probe_key, keep_probe, keyed_log_path, method_knob, pr_tag,
                                            probes_path, shared_probes)
from cmbench.calibration.target_quantity import PR
from cmbench.errors import ConfigError
from cmbench.hashing import config_hash
from cmbench.methods.base import Method
from cmbench.methods.knobs import Knob
from cmbench.methods.registry import method_class, method_names


@dataclass
class Share(Method):
    """Test method: the fake meter's PR is its knob ``share`` itself."""

    name = "share"
    knob = Knob("share", 0.0, 0.9)

    share: float = 0.25


@dataclass
class Window(Method):
    """Test method: a whole-valued knob; the fake meter's PR is ``1 - window / 10`` (larger prunes less)."""

    name = "window"
    knob = Knob("window", 0, 10, increasing=False, integer=True)

    window: int = 2


@dataclass
class Scored(Method):
    """Test method deciding by a threshold on scores ``0.00, 0.01, .., 0.99``: PR = share of scores below
    ``gamma`` (the fake meter asks it for its scores, so the calibration's score guess records them)."""

    name = "scored"
    knob = Knob("gamma", 0.0, 1.0)

    gamma: float = 0.1

    def token_scores(self) -> torch.Tensor:
        return torch.arange(100) / 100

    def keep_rule(self, scores: torch.Tensor) -> torch.Tensor:
        return scores >= self.gamma


@dataclass
class Nameless(Method):
    """Test method without a registered name or a knob."""


def target(cls: type) -> str:
    """The ``_target_`` import path of a test method class defined here."""
    return f"{__name__}.{cls.__name__}"


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """:func:`calibrate_method` with fakes: ``lab.run(method_cfg, target, **kw)`` calibrates in ``tmp_path``.

    The calibration tasks are ``t0 ..`` (``lab.tasks`` logs ``(root, n)``), the code identity is ``"c0de"``
    (``lab.code`` logs its arguments), and the meter (``lab.meters`` logs each one built) returns ``Scored``'s
    pruned share or ``lab.curve(knob value)``; ``lab.measured`` logs every ``(value, PR)`` it measured.
    ``lab.floor`` (default 0) plays a storage format's saving with nothing pruned: FullKV measures it, and
    every other measurement ``m`` reads ``floor + (1 - floor) * m``.
    """
    lab = SimpleNamespace(tmp=tmp_path, tasks=[], code=[], meters=[], measured=[], curve=float, floor=0.0)

    def tasks(cal_cfg, n):
        lab.tasks.append((str(cal_cfg.data.root), n))
        return [SimpleNamespace(task_id=f"t{i}") for i in range(n)]

    def code(cls, backbone, manifest):
        lab.code.append((cls, backbone, str(manifest)))
        return SimpleNamespace(hash="c0de", parts={"method": cls.__name__, "manifest": str(manifest)})

    class Meter:
        def __init__(self, cfg, task_list, on_task=None, quantity=PR):
            lab.meters.append((str(cfg.data.root), [t.task_id for t in task_list], on_task))
            self.on_task, self.n, self.quantity = on_task, len(task_list), quantity

        def __call__(self, method):
            if method.name == "fullkv":
                lab.measured.append(("fullkv", lab.floor))
                return lab.floor
            value = getattr(method, type(method).knob.name)
            if isinstance(method, Scored):
                pr = int((~method.keep_rule(method.token_scores())).sum()) / 100
            else:
                pr = lab.curve(value)
            pr = lab.floor + (1 - lab.floor) * pr
            lab.measured.append((value, pr))
            if self.on_task is not None:
                self.on_task(self.n, self.n)
            return pr

    monkeypatch.setattr(matched_pr, "calibration_tasks", tasks)
    monkeypatch.setattr(matched_pr, "code_identity", code)
    monkeypatch.setattr(matched_pr, "PRMeter", Meter)

    def config(method):
        return OmegaConf.create({
            "method": method, "seed": 2, "out_dir": str(tmp_path / "runs"), "calibration": {"root": None},
            "data": {"name": "miniworld", "adapter": "miniworld", "root": str(tmp_path / "suite"), "world_seed": 0,
                     "manifest": "manifest.jsonl", "check_counts": True},
            "backbone": {"name": "tiny", "path": "w.safetensors"}, "generation": {"continuation_frames": 8},
        })

    lab.config = config
    lab.run = lambda method, target_pr, **kw: calibrate_method(config(method), target_pr, **kw)
    lab.folder = tmp_path / "runs" / "calibration"
    return lab


SHARE = {"_target_": target(Share), "name": "share", "share": 0.25, "sink_chunks": "${seed}"}


# --- calibrate_method end to end ----------------------------------------------------------------------------


def test_a_configured_value_on_target_is_the_calibration_after_one_probe(lab):
    """Share at 0.25 measures PR 0.25 = the target: one probe; every field and file follows by hand."""
    probes, progress = [], []
    result = lab.run(SHARE, 0.25, on_probe=lambda v, p: probes.append((v, p)),
                     on_task=lambda done, total: progress.append((done, total)))
    root, tmp = f"{lab.tmp}/suite_calibration", lab.tmp
    manifest = f"{root}/manifest.jsonl"
    assert probes == [(0.25, 0.25)] and progress == [(4, 4)] and lab.measured == [(0.25, 0.25)]
    assert lab.tasks == [(root, 4)] and lab.code == [(Share, {"name": "tiny", "path": "w.safetensors"}, manifest)]
    assert [m[:2] for m in lab.meters] == [(root, ["t0", "t1", "t2", "t3"])]
    probe_key = calibration_probe_key({
        "method": {"_target_": target(Share), "name": "share", "sink_chunks": 2},  # resolved, without the knob
        "knob": asdict(Share.knob),
        "data": {"name": "miniworld", "adapter": "miniworld", "root": root, "world_seed": 1,
                 "manifest": "manifest.jsonl", "check_counts": False, "task_ids": ["t0", "t1", "t2", "t3"]},
        "backbone": {"name": "tiny", "path": "w.safetensors"}, "generation": {"continuation_frames": 8},
        "seed": 2, "code": "c0de"})
    key = config_hash({"probe_key": probe_key, "target_pr": 0.25, "tolerance": 0.005, "max_probes": 14})
    yaml_path, log_path = lab.folder / "method" / "share_pr25.yaml", lab.folder / "share_pr25.json"
    assert result == Calibration(
        method="share", label="share@pr25", knob="share", value=0.25, calibration_pr=0.25, target_pr=0.25,
        tolerance=0.005, within_tolerance=True, note="", probes=[[0.25, 0.25]],
        data={"root": root, "world_seed": 1, "task_ids": ["t0", "t1", "t2", "t3"]},
        code={"method": "Share", "manifest": manifest}, key=key, yaml=str(yaml_path), log=str(log_path),
        probe_key=probe_key, reused_probes=[])
    assert result.cached is False
    assert yaml_path.read_text() == (f"# share calibrated to PR 0.25 on {root} (log: share_pr25.json)\n"
                                     f"_target_: {target(Share)}\nname: share\nshare: 0.25\nsink_chunks: ${{seed}}\n")
    assert log_path.read_text() == result.to_json()
    assert (lab.folder / "keyed" / f"share_pr25_{key}.json").read_text() == result.to_json()
    assert (lab.folder / "keyed" / f"share_probes_{probe_key}.json").read_text() == json.dumps(
        {"method": "share", "probe_key": probe_key, "probes": [[0.25, 0.25]]}, indent=2) + "\n"
    assert sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file()) == sorted(
        Path("runs/calibration") / p for p in (".cmbench-written.json", "method/share_pr25.yaml", "share_pr25.json",
                                                f"keyed/share_pr25_{key}.json", f"keyed/share_probes_{probe_key}.json"))


KIVI4 = {"name": "kivi", "bits": 4, "group_size": 32, "residual": 128}


def test_a_quantized_storage_format_is_its_own_calibration_with_its_own_probes(lab):
    """A target in a quantized format is measured in that format, so it is another calibration than full
    precision's (key, probes and logged setting name the format) and another bit width another again;
    ``storage=fp`` keeps the key a config without a storage group has (full-precision folders stay valid)."""
    def run(storage):
        cfg = lab.config(SHARE)
        if storage is not None:
            cfg.storage = storage
        return calibrate_method(cfg, 0.25)

    plain, fp, kivi4, kivi2 = run(None), run({"name": "fp"}), run(KIVI4), run({**KIVI4, "bits": 2})
    assert fp.key == plain.key and fp.probe_key == plain.probe_key and fp.cached
    assert len({plain.probe_key, kivi4.probe_key, kivi2.probe_key}) == 3
    assert not kivi4.cached and not kivi2.cached and len(lab.measured) == 3  # each format measured afresh
    assert not any(k.startswith("storage") for k in plain.setting)
    assert {k: v for k, v in kivi4.setting.items() if k.startswith("storage")} == {
        "storage.name": "kivi", "storage.bits": 4, "storage.group_size": 32, "storage.residual": 128, "storage.stages": 1}


def test_a_calibration_is_reused_and_its_files_written_only_when_they_are_not_its_own(lab):
    first = lab.run(SHARE, 0.25)
    yaml_path, log_path = Path(first.yaml), Path(first.log)
    yaml_text, measured = yaml_path.read_text(), len(lab.measured)
    probes = []
    again = lab.run(SHARE, 0.25, on_probe=lambda v, p: probes.append(v))
    assert again == first and again.cached and probes == [] and len(lab.measured) == measured
    # a yaml that is not exactly what CMBench writes for the log is written again (it is data: it could name
    # any class to import)
    yaml_path.write_text(yaml_text + "# edited\n")
    assert lab.run(SHARE, 0.25).cached and yaml_path.read_text() == yaml_text
    yaml_path.unlink()  # a missing yaml is written again
    assert lab.run(SHARE, 0.25).cached and yaml_path.read_text() == yaml_text
    log_path.write_text(log_path.read_text().replace('"note": ""', '"note": "edited"'))  # same key, other text
    yaml_path.write_text(yaml_text + "# edited\n")
    assert lab.run(SHARE, 0.25).cached
    assert log_path.read_text() == first.to_json() and yaml_path.read_text() == yaml_text
    assert len(lab.measured) == measured


def test_calibrations_of_two_settings_are_each_reused_and_the_target_files_name_the_last(lab):
    """Four tasks (first key), then two (another key): each is reused from its keyed log, and the files named
    after the target follow whichever was found or reused last."""
    first = lab.run(SHARE, 0.25)
    second = lab.run(SHARE, 0.25, n_tasks=2)
    assert second.key != first.key and second.data["task_ids"] == ["t0", "t1"]
    assert second.probe_key != first.probe_key  # other tasks: other probes
    log_path = Path(first.log)
    assert json.loads(log_path.read_text())["key"] == second.key
    measured = len(lab.measured)
    assert lab.run(SHARE, 0.25) == first and len(lab.measured) == measured
    assert log_path.read_text() == first.to_json()
    # a folder from before logs were kept under their keys: the log named after the target is reused and kept
    keyed = keyed_log_path(log_path, first.key)
    keyed.unlink()
    assert lab.run(SHARE, 0.25).cached and keyed.read_text() == first.to_json() and len(lab.measured) == measured
    # a damaged keyed log, and no yaml: calibrated again (the probe is not measured again: it is cached)
    keyed.write_text("{not json")
    Path(first.yaml).unlink()
    redone = lab.run(SHARE, 0.25)
    assert not redone.cached and redone == Calibration(**{**asdict(first), "probes": [], "reused_probes": [[0.25, 0.25]]})
    assert keyed.read_text() == redone.to_json()
    # a keyed log that is not a calibration at all: the same
    keyed.write_text(json.dumps({"method": "share"}))
    Path(first.yaml).unlink()
    assert not lab.run(SHARE, 0.25).cached


def test_whole_valued_knobs_land_on_the_nearest_achievable_pr_and_say_which_neighbours_were_measured(lab):
    """Window PR = 1 - window / 10: windows 3..6 known, target 0.55 lies between 4 (PR 0.6) and 5 (PR 0.5),
    both 0.05 away; the tie goes to the smaller value, nothing new is measured."""
    lab.curve = lambda v: 1.0 - v / 10
    cfg = {"_target_": target(Window), "name": "window"}
    first = lab.run(cfg, 0.8)  # the configured window 2 gives PR 0.8 at once
    assert first.probes == [[2, 0.8]] and isinstance(first.value, int) and first.note == ""
    for v in (3, 4, 5, 6):
        keep_probe(lab.folder, "window", first.probe_key, v, 1.0 - v / 10)
    measured = len(lab.measured)
    result = lab.run(cfg, 0.55)
    assert len(lab.measured) == measured and result.probes == []
    assert result.reused_probes == [[2, 0.8], [3, 0.7], [4, 0.6], [5, 0.5], [6, 0.4]]
    assert all(isinstance(v, int) for v, _ in result.reused_probes)
    assert (result.value, result.calibration_pr, result.within_tolerance) == (4, 0.6, False)
    assert result.note == ("window takes whole values and none lands within 0.0050 of PR 0.5500: window=4 gives the "
                           "nearest achievable PR 0.6000 (window=3: PR 0.7000, window=5: PR 0.5000)")
    assert result.probe_key == first.probe_key and result.label == "window@pr55"


def test_the_notes_of_a_search_that_missed_the_target():
    note = matched_pr._note
    assert note(Share.knob, 0.25, 0.25, 0.5, 0.25, []) == ""  # exactly the tolerance away: within it
    assert note(Share.knob, 0.3, 0.3, 0.5, 0.005, [(0.1, 0.1), (0.3, 0.3)]) == \
        "the search stopped after 2 probes at PR 0.3000, 0.2000 from the target"
    # whole values, no neighbour measured: nothing in parentheses
    assert note(Window.knob, 2.0, 0.8, 0.35, 0.005, [(2.0, 0.8), (7.0, 0.3)]) == \
        "window takes whole values and none lands within 0.0050 of PR 0.3500: window=2 gives the nearest achievable PR 0.8000"


def test_a_pr_exactly_the_tolerance_away_is_within_it(lab):
    result = lab.run(SHARE, 0.5, tolerance=0.25)  # share 0.25 -> PR 0.25, |0.25 - 0.5| = 0.25
    assert result.within_tolerance and result.note == "" and result.probes == [[0.25, 0.25]]
    assert result.key == config_hash({"probe_key": result.probe_key, "target_pr": 0.5, "tolerance": 0.25,
                                      "max_probes": 14})


def test_the_score_guess_aims_the_second_probe_from_the_scores_the_first_recorded(lab):
    """Scored at gamma 0.1 prunes 10 of 100 scores (PR 0.1); the recorded scores predict the gamma pruning
    half of them, so the second probe lands on PR 0.5 (a gamma near 0.5)."""
    result = lab.run({"_target_": target(Scored), "name": "scored"}, 0.5, max_probes=5)
    assert result.probes[0] == [0.1, 0.1] and len(result.probes) == 2
    gamma, pr = result.probes[1]
    assert 0.49 < gamma < 0.51 and pr == 0.5 and result.value == gamma
    assert result.key == config_hash({"probe_key": result.probe_key, "target_pr": 0.5, "tolerance": 0.005,
                                      "max_probes": 5})


def test_a_search_limited_to_two_probes_stops_there(lab):
    lab.curve = lambda v: 0.4 if v < 0.5 else 0.6  # never within the tolerance of 0.5
    result = lab.run(SHARE, 0.5, max_probes=2)
    assert len(result.probes) == 2 and not result.within_tolerance
    assert result.note == "the search stopped after 2 probes at PR 0.4000, 0.1000 from the target"


@pytest.mark.parametrize("target_pr, tolerance, message", [
    (-0.1, 0.005, "target_pr=-0.1: expected a pruning ratio in [0, 1), e.g. target_pr=0.85"),
    (1.0, 0.005, "target_pr=1.0: expected a pruning ratio in [0, 1), e.g. target_pr=0.85"),
    (0.5, 0.0, "calibration.tolerance=0.0: expected a PR difference in (0, 1)"),
    (0.5, 1.0, "calibration.tolerance=1.0: expected a PR difference in (0, 1)"),
])
def test_a_target_or_tolerance_out_of_range_is_refused_before_any_work(lab, target_pr, tolerance, message):
    with pytest.raises(ConfigError) as err:
        lab.run(SHARE, target_pr, tolerance=tolerance)
    assert str(err.value) == message and lab.tasks == [] and not lab.folder.exists()


def test_a_zero_target_is_a_target(lab):
    result = lab.run({**SHARE, "share": 0.0}, 0.0)
    assert result.label == "share@pr0" and result.value == 0.0 and result.within_tolerance


def test_an_unknown_knob_such_as_the_old_token_budget_is_refused_in_one_line(lab):
    with pytest.raises(ConfigError) as err:
        lab.run({"name": "decoprune", "token_budget": 3}, 0.85)
    assert str(err.value).startswith("method 'decoprune' has no knob(s) token_budget; its knobs are: ")
    assert "\n" not in str(err.value) and lab.meters == [] and not lab.folder.exists()


def test_an_unknown_knob_is_refused_before_the_calibration_tasks_are_built(lab):
    with pytest.raises(ConfigError, match="no knob"):
        lab.run({"name": "decoprune", "token_budget": 3}, 0.85)
    assert lab.tasks == []


def test_a_process_waiting_for_another_calibration_says_which(lab, monkeypatch, capsys):
    locks = []

    class Held:
        """A lock another process holds first: it reports the holder, then lets this one in."""

        def __init__(self, path, on_wait):
            locks.append(path)
            self.on_wait = on_wait

        def __enter__(self):
            self.on_wait("process 4321")

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(matched_pr, "RunLock", Held)
    result = lab.run(SHARE, 0.25)
    assert locks == [keyed_log_path(Path(result.log), result.key)]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("calibrate: waiting for process 4321, which is calibrating share to PR 0.25 "
                                         f"({result.log})\n")


# --- options and method checks ----------------------------------------------------------------------------


def options(**over):
    """:func:`calibration_options` of 4 tasks, 14 probes and tolerance 0.005, with ``over`` replacing some."""
    return calibration_options(OmegaConf.create({"calibration": {"tasks": 4, "max_probes": 14, "tolerance": 0.005,
                                                                 **over}}))


def test_the_calibration_options_as_given():
    assert options() == {"tolerance": 0.005, "n_tasks": 4, "max_probes": 14}
    assert options(tasks=1, max_probes=2, tolerance=0.999) == {"tolerance": 0.999, "n_tasks": 1, "max_probes": 2}


@pytest.mark.parametrize("over, message", [
    ({"tasks": 0}, "calibration.tasks=0: expected a positive number of calibration tasks"),
    ({"tasks": True}, "calibration.tasks=True: expected a positive number of calibration tasks"),
    ({"tasks": "3"}, "calibration.tasks='3': expected a positive number of calibration tasks"),
    ({"max_probes": 1}, "calibration.max_probes=1: expected a whole number >= 2 (both ends of the range)"),
    ({"max_probes": True}, "calibration.max_probes=True: expected a whole number >= 2"),
    ({"max_probes": 2.5}, "calibration.max_probes=2.5: expected a whole number >= 2"),
    ({"tolerance": 0}, "calibration.tolerance=0: expected a PR difference in (0, 1), e.g. 0.005"),
    ({"tolerance": 1}, "calibration.tolerance=1: expected a PR difference in (0, 1), e.g. 0.005"),
    ({"tolerance": True}, "calibration.tolerance=True: expected a PR difference in (0, 1)"),
    ({"tolerance": "0.1"}, "calibration.tolerance='0.1': expected a PR difference in (0, 1)"),
])
def test_bad_calibration_options_are_named_with_what_is_expected(over, message):
    with pytest.raises(ConfigError) as err:
        options(**over)
    assert str(err.value).startswith(message)


def test_a_method_without_a_knob_is_refused_with_the_methods_that_have_one():
    with_knob = ", ".join(n for n in method_names() if method_class(n).knob is not None)
    assert "decoprune" in with_knob and "fullkv" not in with_knob
    tail = ("declares no knob that sets its pruning ratio (its class's `knob` is None: what it keeps is fixed by its "
            f"rule), so there is nothing to calibrate; methods with one: {with_knob}")
    for cfg, name in (({"name": "fullkv"}, "fullkv"), ({"_target_": target(Nameless)}, "Nameless")):
        with pytest.raises(ConfigError) as err:
            method_knob(cfg)
        assert str(err.value) == f"method {name!r} {tail}"


@pytest.mark.parametrize("extra, message", [
    ({"target_pr": 0.8}, "method 'decoprune': method.target_pr=0.8 asks for the calibration this command makes: give "
                         "the target as target_pr=0.8 and drop method.target_pr"),
    ({"quota_pr": 0.8, "target_pr": 0.7}, "method 'decoprune': method.quota_pr=0.8 puts it in quota mode, which "
                                          "replaces its own rule; calibrate searches its own knob (gamma): drop "
                                          "method.quota_pr"),
    ({"quota_tokens": 100}, "method 'decoprune': method.quota_tokens=100 puts it in quota mode"),
])
def test_quota_mode_and_an_inline_target_have_nothing_to_calibrate(extra, message):
    with pytest.raises(ConfigError) as err:
        method_knob({"name": "decoprune", **extra})
    assert str(err.value).startswith(message)


def test_a_method_with_a_knob_gives_it():
    assert method_knob({"_target_": target(Window), "window": 3}) == Window.knob
    assert method_knob({"name": "decoprune", "quota_pr": None, "target_pr": None}).name == "gamma"


# --- names and files --------------------------------------------------------------------------------------


@pytest.mark.parametrize("target_pr, tag", [(0.85, "pr85"), (0.875, "pr87.5"), (0.0, "pr0"), (0.0123456, "pr1.2346"),
                                             (0.5, "pr50")])
def test_a_target_tag_is_the_percentage_to_four_decimals(target_pr, tag):
    assert pr_tag(target_pr) == tag


def test_file_names(tmp_path):
    assert calibration_paths(tmp_path, "deco prune", 0.85) == (
        tmp_path / "calibration" / "method" / "deco-prune_pr85.yaml", tmp_path / "calibration" / "deco-prune_pr85.json")
    assert keyed_log_path(Path("/a/calibration/x_pr85.json"), "k1") == Path("/a/calibration/keyed/x_pr85_k1.json")
    assert probes_path(tmp_path, "deco prune", "k1") == tmp_path / "keyed" / "deco-prune_probes_k1.json"
    for names in (lambda: calibration_paths(tmp_path, "..", 0.85), lambda: probes_path(tmp_path, "..", "k1"),
                  lambda: shared_probes(tmp_path, "..", "k1")):
        with pytest.raises(ConfigError, match=r"^method\.name='\.\.' cannot name a folder"):
            names()


def test_a_calibration_log_is_its_fields_as_indented_json_without_the_cached_flag_or_the_files_written():
    cal = Calibration(method="m", label="m@pr50", knob="k", value=1, calibration_pr=0.5, target_pr=0.5,
                      tolerance=0.01, within_tolerance=True, note="", probes=[[1, 0.5]], data={}, code={}, key="x",
                      yaml="y", log="l", cached=True, written=["y"])
    fields = {k: v for k, v in asdict(cal).items() if k not in ("cached", "written")}
    assert cal.to_json() == json.dumps(fields, indent=2) + "\n"


def log(folder: Path, name: str, method="m", key="k1", probes=([0.1, 0.2],)) -> Path:
    """Write a calibration-log-like JSON ``{"method", "probe_key", "probes"}`` at ``folder / name``."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"method": method, "probe_key": key, "probes": list(probes)}))
    return path


def test_probes_are_shared_from_the_probe_cache_and_the_logs_of_the_same_method_and_key(tmp_path, capsys):
    log(tmp_path, "m_pr10.json", probes=[[0.1, 0.2]])
    log(tmp_path, "keyed/m_pr20_abc.json", probes=[[0.3, 0.4]])
    log(tmp_path, "keyed/m_probes_k1.json", probes=[[0.5, 0.6]])
    log(tmp_path, "m_pr30.json", method="other", probes=[[0.7, 0.8]])  # another method's
    log(tmp_path, "m_pr40.json", key="k2", probes=[[0.7, 0.8]])  # another setting's
    log(tmp_path, "n_pr50.json", probes=[[0.7, 0.8]])  # named after another method
    log(tmp_path, "m_pr60.json", probes=[]).write_text(json.dumps({"method": "m", "probe_key": "k1"}))  # no probes
    (tmp_path / "m_pr70.json").write_text(json.dumps([["m", "k1"]]))  # not a log
    (tmp_path / "keyed" / "m_pr00.json").write_text("{damaged")  # read first, unreadable: skipped
    assert shared_probes(tmp_path, "m", "k1") == {0.1: 0.2, 0.3: 0.4, 0.5: 0.6}
    assert shared_probes(tmp_path, "m", "k1", logs=False) == {0.5: 0.6}
    assert capsys.readouterr().err == ""
    assert shared_probes(tmp_path / "nowhere", "m", "k1") == {}


def test_keeping_a_probe_merges_it_into_the_probe_cache_only(tmp_path):
    log(tmp_path, "m_pr10.json", probes=[[0.9, 0.95]])  # a log: not copied into the cache
    keep_probe(tmp_path, "m", "k1", 0.3, 0.4)
    keep_probe(tmp_path, "m", "k1", 1, 0.2)
    keep_probe(tmp_path, "m", "k1", 0.3, 0.5)  # measured again: the latest PR
    path = probes_path(tmp_path, "m", "k1")
    assert path.read_text() == json.dumps({"method": "m", "probe_key": "k1", "probes": [[0.3, 0.5], [1.0, 0.2]]},
                                          indent=2) + "\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_the_probe_cache_keeps_its_key(tmp_path):
    keep_probe(tmp_path, "m", "k1", 0.3, 0.4)
    keep_probe(tmp_path, "m", "k2", 0.5, 0.6)
    assert shared_probes(tmp_path, "m", "k1") == {0.3: 0.4} and shared_probes(tmp_path, "m", "k2") == {0.5: 0.6}


def test_logged_probes_may_reach_both_ends_of_the_pr_range(tmp_path, capsys):
    log(tmp_path, "m_pr10.json", probes=[[0.0, 0.0], [7, 1.0], [-3.5, 1]])
    assert shared_probes(tmp_path, "m", "k1") == {0.0: 0.0, 7.0: 1.0, -3.5: 1.0}
    assert capsys.readouterr().err == ""


def test_a_damaged_probe_is_quoted_to_eighty_characters(tmp_path, capsys):
    entry = [0.5, "x" * 100]
    path = log(tmp_path, "m_pr10.json", probes=[[0.1, 0.2], entry])
    assert shared_probes(tmp_path, "m", "k1") == {}
    assert capsys.readouterr().err == (f"calibrate: ignoring the probes in {path}: probe 1 is {json.dumps(entry)[:80]}, "
                                       "not a [value, PR] pair of numbers\n")
