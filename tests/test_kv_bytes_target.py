"""``method.target_bytes`` / ``calibrate target_bytes=``: a device-bytes target through the very calibration
a PR target takes (the same search, meter and files, the quantity a parameter), with the fakes of
test_matched_pr_units (its meter's value for a knob is the searched share)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from cmbench.calibration.matched_pr import calibration_paths
from cmbench.calibration.target_pr import requested_target, resolve_target_pr
from cmbench.calibration.target_quantity import BYTES, PR, bytes_floor
from cmbench.errors import ConfigError
from test_matched_pr_units import SHARE, Scored, lab, target  # noqa: F401  (the fixture)


def test_the_bytes_quantity_searches_the_share_saved():
    ledger = SimpleNamespace(kv_bytes_ratio=lambda: 0.25, pruning_ratio=lambda: 0.5)
    assert BYTES.measured(ledger) == 0.75 and PR.measured(ledger) == 0.5
    assert BYTES.searched(0.15) == pytest.approx(0.85) and BYTES.shown(0.85) == pytest.approx(0.15)
    assert PR.searched(0.85) == 0.85 == PR.shown(0.85)
    assert (BYTES.tag(0.15), PR.tag(0.875)) == ("bytes15", "pr87.5")
    assert PR.tag(0.0512346) == "pr5.1235"  # four decimals of a percent in a file name and a label


@pytest.mark.parametrize("name, value", [("decoprune", 100.0), ("decoprune_reverse", 1e-06), ("streaming", 0),
                                         ("tempcache", -1.0)])
def test_the_least_window_is_the_method_at_its_knobs_least_keeping_end(name, value):
    """The method whose sink and recent window set the bytes floor is built at the end of its knob's range
    that keeps least, the value itself (a fractional end is not rounded to a whole number)."""
    from cmbench.calibration.target_quantity import least_window

    method, knob, chunks = least_window({"name": name})
    assert getattr(method, knob.name) == value and type(getattr(method, knob.name)) is type(value)
    assert chunks == method.sink_chunks + method.recent_chunks


@pytest.mark.parametrize("quantity, value, message", [
    (BYTES, 0.0, "method.target_bytes=0.0: expected a share of FullKV's device KV bytes in (0, 1], "
                 "e.g. method.target_bytes=0.15"),
    (BYTES, 1.5, "method.target_bytes=1.5: expected a share of FullKV's device KV bytes in (0, 1], "
                 "e.g. method.target_bytes=0.15"),
    (BYTES, True, "method.target_bytes=True: expected a share of FullKV's device KV bytes in (0, 1], "
                  "e.g. method.target_bytes=0.15"),
    (PR, 1.0, "method.target_pr=1.0: expected a pruning ratio in [0, 1), e.g. method.target_pr=0.85"),
])
def test_a_target_out_of_range_is_one_line_naming_the_key(quantity, value, message):
    cfg = OmegaConf.create({"method": {"name": "share", quantity.key: value}})
    with pytest.raises(ConfigError) as err:
        requested_target(cfg, quantity)
    assert str(err.value) == message


def test_both_targets_at_once_are_refused():
    cfg = OmegaConf.create({"method": {"name": "share", "target_pr": 0.8, "target_bytes": 0.2}})
    with pytest.raises(ConfigError, match=r"^method share: method.target_pr and method.target_bytes both set the knob"):
        resolve_target_pr(cfg, verbose=False)


def test_a_bytes_target_is_calibrated_by_the_same_search_into_its_own_files(lab):  # noqa: F811
    """Share's fake meter gives the share saved = the knob: bytes 0.25 of FullKV's is share 0.75."""
    from cmbench.calibration.matched_pr import calibrate_method

    pr_result = calibrate_method(lab.config(SHARE), 0.75)  # the PR target the bytes target mirrors
    result = calibrate_method(lab.config(SHARE), 0.25, quantity=BYTES)
    assert (result.target_pr, result.quantity, result.label) == (0.25, "bytes", "share@bytes25")
    assert result.value == pytest.approx(0.75, abs=0.005) and result.within_tolerance
    assert result.calibration_pr == pytest.approx(1 - result.value)  # shown as bytes over FullKV's
    assert all(v == p for v, p in result.probes)  # searched: the share saved, the fake's knob value itself
    assert [v for v, _ in result.probes] == [v for v, _ in pr_result.probes]  # the PR search's very steps
    yaml_path, log_path = calibration_paths(lab.tmp / "runs", "share", 0.25, BYTES)
    assert (result.yaml, result.log) == (str(yaml_path), str(log_path)) and log_path.name == "share_bytes25.json"
    assert yaml_path.read_text().startswith("# share calibrated to KV bytes / FullKV's 0.25 on ")
    # its own probes: a bytes probe is not a PR probe (a storage format saves bytes at the same PR)
    assert result.probe_key != pr_result.probe_key and result.key != pr_result.key
    assert pr_result.quantity == "pr" and pr_result.label == "share@pr75"


def test_method_target_bytes_resolves_into_the_knob_and_its_record_fields(lab):  # noqa: F811
    cfg = OmegaConf.merge(lab.config({**SHARE, "target_bytes": 0.25}),
                          {"calibration": {"tolerance": 0.005, "tasks": 2, "max_probes": 6}})
    resolved = resolve_target_pr(cfg, verbose=False)
    share = resolved.cfg.method.share
    assert share == pytest.approx(0.75, abs=0.005) and "target_bytes" not in resolved.cfg.method
    assert resolved.cfg.label == "share@sink_chunks=2,bytes25"
    fields = resolved.record_fields()
    assert fields["target_bytes"] == 0.25 and fields["calibration_bytes"] == pytest.approx(1 - share)
    assert fields["target_pr"] is None and fields["calibration_pr"] is None


def test_a_bytes_calibration_shows_its_probes_and_result_as_bytes_not_as_pr(lab, capsys):  # noqa: F811
    """What the user reads while a bytes target is calibrated (and after): each probe's bytes over
    FullKV's (1 - the share saved the search measures), never a PR; a PR calibration still shows PR."""
    from cmbench.cli.calibrate import describe

    cfg = OmegaConf.merge(lab.config({**SHARE, "target_bytes": 0.25}),
                          {"calibration": {"tolerance": 0.005, "tasks": 2, "max_probes": 6}})
    resolve_target_pr(cfg, verbose=True)
    probes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  probe share=")]
    assert probes and all(": KV bytes / FullKV's " in line and "PR" not in line for line in probes)
    shown = [float(line.split("FullKV's ")[1].split(" ")[0]) for line in probes]
    assert shown[-1] == pytest.approx(0.25, abs=0.005)  # the bytes ratio, not the 0.75 saved
    from cmbench.calibration.matched_pr import calibrate_method

    (line, *_) = describe(calibrate_method(lab.config(SHARE), 0.25, quantity=BYTES))
    assert "calibration KV bytes / FullKV's 0.25" in line and "PR" not in line
    (line, *_) = describe(calibrate_method(lab.config(SHARE), 0.75))
    assert "calibration PR 0.74" in line and "KV bytes" not in line


# ------------------------------------------------------------------ the floor of a bytes target


def test_the_bytes_floor_sums_the_window_over_fullkvs_history_chunk_by_chunk():
    # chunks of 4 frames after a 12-frame context: FullKV holds 12, 16, 20; an 8-frame window holds 8 each
    assert bytes_floor(8, 12, 12, 4) == pytest.approx(24 / 48)
    # a window longer than the early history holds all of it: min(12, 14) + 14 + 14 over 12 + 16 + 20
    assert bytes_floor(14, 12, 12, 4) == pytest.approx(40 / 48)
    assert bytes_floor(8, 0, 0, 4) == 1.0  # no continuation chunk: nothing to save


def floor_config(method: dict) -> OmegaConf:
    """A root config of the tiny backbone on MiniWorld's shape (192-frame contexts, 16 generated)."""
    from cmbench.backbones.tiny import DEFAULT_WEIGHTS

    cfg = {"method": method, "storage": {"name": "fp"}, "generation": {"continuation_frames": 16},
           "data": {"clips": 6, "clip_frames": 32, "fps": 16},
           "backbone": {"path": str(DEFAULT_WEIGHTS), "context": {"fps": 16, "temporal_stride": 1}}}
    return OmegaConf.create(cfg)


def test_a_bytes_target_below_the_sink_and_recent_window_is_refused_in_one_line():
    # streaming's knob is its recent window: at its least (0 chunks) only the 1-chunk sink stays,
    # 4 frames against 192 + 196 + 200 + 204: 16 / 792
    with pytest.raises(ConfigError) as err:
        requested_target(floor_config({"name": "streaming", "target_bytes": 0.02}), BYTES)
    assert str(err.value) == (
        "method.target_bytes=0.02: below 0.0202, what streaming's sink and recent window alone store (1 + 0 chunks "
        "of 4 latent frames, kept whatever its recent_chunks, against FullKV's 192 context + 16 continuation "
        "frames); give method.target_bytes >= 0.0203")
    assert "\n" not in str(err.value)
    assert requested_target(floor_config({"name": "streaming", "target_bytes": 0.0203}), BYTES) == 0.0203
    # decoprune keeps its 1-chunk sink and 1-chunk recent window whatever its gamma: 32 / 792
    with pytest.raises(ConfigError, match=r"^method.target_bytes=0.04: below 0.0404, what decoprune's sink and recent "
                                          r"window alone store \(1 \+ 1 chunks"):
        requested_target(floor_config({"name": "decoprune", "target_bytes": 0.04}), BYTES)
    wide = floor_config({"name": "decoprune", "target_bytes": 0.1, "sink_chunks": 4, "recent_chunks": 4})
    with pytest.raises(ConfigError, match=r"below 0.1616, .*\(4 \+ 4 chunks"):  # 32 frames: 128 / 792
        requested_target(wide, BYTES)


def test_a_backbone_that_declares_its_chunk_and_compresses_time_by_its_default_stride():
    # a Wan-shaped backbone: 3-latent-frame chunks, temporal stride 4 by default; 192 frames at 16 fps become
    # 198 padded pixel frames, 51 latent frames; 12 generated frames are 4 chunks: 4 x 6 / (51 + 54 + 57 + 60)
    cfg = OmegaConf.merge(floor_config({"name": "decoprune", "target_bytes": 0.1}),
                          {"generation": {"continuation_frames": 12}})
    cfg.backbone = {"chunk_frames": 3, "context": {"fps": 16}}
    with pytest.raises(ConfigError, match=r"below 0.1081, .*\(1 \+ 1 chunks of 3 latent frames, .*against FullKV's 51 "
                                          r"context \+ 12 continuation frames\)"):
        requested_target(cfg, BYTES)
    assert PR.check(0.0, "method.target_pr") == 0.0  # no pruning is a PR target too


@pytest.mark.parametrize("change", [
    {"storage": {"name": "kivi"}},  # fewer bytes per token: the fp floor does not bind
    {"data": {"clips": None}},  # a dataset whose contexts the config does not size
    {"backbone": {"path": "/nowhere/weights.safetensors"}},  # the chunk is not declared
    {"method": {"_target_": "my.Plugin"}},  # a plug-in's rule may keep less than its window
    {"method": {"name": "my_plugin"}},  # ... and its name is not a registered method's
    {"method": {"max_history_tokens": 64}},  # a cap below the window
])
def test_no_floor_is_checked_where_it_cannot_be_computed(change):
    cfg = OmegaConf.merge(floor_config({"name": "streaming", "target_bytes": 0.01}), change)
    assert requested_target(cfg, BYTES) == 0.01


def test_the_calibrate_command_refuses_a_bytes_target_below_the_floor_under_its_own_key(tmp_path):
    from cmbench.calibration.matched_pr import calibrate_method

    cfg = OmegaConf.merge(floor_config({"name": "streaming"}), {"out_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^target_bytes=0.01: below 0.0202, what streaming's"):
        calibrate_method(cfg, 0.01, quantity=BYTES)


def test_the_shipped_configs_give_the_floor_of_a_run(tmp_path):
    """``run method=decoprune method.target_bytes=0.01``: the tiny backbone and MiniWorld configs as shipped
    size the floor (192-frame contexts, 4-frame chunks) before any calibration or model."""
    from cmbench.api import compose_config

    with pytest.raises(ConfigError, match=r"^method.target_bytes=0.01: below 0.0404, what decoprune's .*against "
                                          r"FullKV's 192 context \+ 16 continuation frames\)"):
        resolve_target_pr(compose_config("decoprune", ["method.target_bytes=0.01", f"out_dir={tmp_path}"]),
                          verbose=False)


def test_a_calibration_in_a_storage_format_is_published_under_its_own_name(lab):  # noqa: F811
    """The same method to the same target in full precision and in KIVI-4 are two calibrations: their yaml and
    log are named apart (the keyed logs already were), so one never overwrites the other's published value."""
    from cmbench.calibration.matched_pr import calibrate_method

    fp = calibrate_method(lab.config(SHARE), 0.25, quantity=BYTES)
    kivi = calibrate_method(OmegaConf.merge(lab.config(SHARE), {"storage": {"name": "kivi", "bits": 4, "group_size": 32, "residual": 128}}), 0.25,
                            quantity=BYTES)
    assert Path(fp.log).name == "share_bytes25.json" and Path(kivi.log).name == "share-kivi4-g32-r128_bytes25.json"
    assert Path(kivi.yaml).name == "share-kivi4-g32-r128_bytes25.yaml" and fp.key != kivi.key
    assert json.loads(Path(fp.log).read_text())["key"] == fp.key  # still its own


KIVI4 = {"storage": {"name": "kivi", "bits": 4, "group_size": 32, "residual": 128}}


def test_a_threshold_method_in_a_quantized_format_is_aimed_from_the_formats_floor(lab):  # noqa: F811
    """FullKV in the format saves 0.8 of the bytes (measured once, first); Scored at gamma 0.1 prunes a
    share 0.1 and saves 0.82. For bytes 0.1 (saving 0.9) the guess from the floor is gamma
    ``0.1 * (0.9 - 0.8) / (0.82 - 0.8) = 0.5``, which lands: two probes. Aimed as if saving were
    proportional to the share through 0 it would probe gamma ~0.11 (saving 0.822) next."""
    from cmbench.calibration.matched_pr import calibrate_method

    lab.floor = 0.8
    scored = {"_target_": target(Scored), "name": "scored"}
    result = calibrate_method(OmegaConf.merge(lab.config(scored), KIVI4), 0.1, quantity=BYTES)
    assert lab.measured[0] == ("fullkv", 0.8) and [v for v, _ in lab.measured].count("fullkv") == 1
    assert [v for v, _ in result.probes] == [0.1, pytest.approx(0.5, abs=0.005)]
    assert result.within_tolerance and result.calibration_pr == pytest.approx(0.1, abs=0.005)


def test_a_bytes_target_above_what_fullkv_stores_in_the_format_is_refused_in_one_line(lab):  # noqa: F811
    """Keeping every token, the format stores 0.2 of FullKV's bytes: no pruning reaches 0.25."""
    from cmbench.calibration.matched_pr import calibrate_method

    lab.floor = 0.8
    with pytest.raises(ConfigError, match=r"^target_bytes=0.25: above the 0.2000 of FullKV's KV bytes that "
                                          r"storage=kivi storage.bits=4 stores keeping every token"):
        calibrate_method(OmegaConf.merge(lab.config(SHARE), KIVI4), 0.25, quantity=BYTES)
    assert lab.measured == [("fullkv", 0.8)]  # refused after the floor's one measurement, before any probe
    assert calibrate_method(OmegaConf.merge(lab.config(SHARE), KIVI4), 0.2, quantity=BYTES).within_tolerance


def test_a_bytes_target_out_of_the_knobs_reach_is_said_in_bytes(lab):  # noqa: F811
    """Share saves at most 0.9 (its knob's top): bytes 0.05 is out of reach, and the error gives the target,
    the measured range and the range end's value as bytes over FullKV's, never as the share saved."""
    from cmbench.calibration.matched_pr import calibrate_method

    with pytest.raises(ConfigError, match=r"^target KV bytes / FullKV's 0\.0500 is outside what share in \[0, 0\.9\] "
                                          r"reaches on the calibration data \(KV bytes / FullKV's 0\.1000 \.\. 0\.\d{4} "
                                          r"measured, share=0\.9 gives 0\.1000\)$"):
        calibrate_method(lab.config(SHARE), 0.05, quantity=BYTES)
