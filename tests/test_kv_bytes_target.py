"""``method.target_bytes`` / ``calibrate target_bytes=``: a device-bytes target through the very calibration
a PR target takes (the same search, meter and files, the quantity a parameter), with the fakes of
test_matched_pr_units (its meter's value for a knob is the searched share)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from cmbench.calibration.matched_pr import calibration_paths
from cmbench.calibration.target_pr import requested_target, resolve_target_pr
from cmbench.calibration.target_quantity import BYTES, PR
from cmbench.errors import ConfigError
from test_matched_pr_units import SHARE, lab  # noqa: F401  (the fixture)


def test_the_bytes_quantity_searches_the_share_saved():
    ledger = SimpleNamespace(kv_bytes_ratio=lambda: 0.25, pruning_ratio=lambda: 0.5)
    assert BYTES.measured(ledger) == 0.75 and PR.measured(ledger) == 0.5
    assert BYTES.searched(0.15) == pytest.approx(0.85) and BYTES.shown(0.85) == pytest.approx(0.15)
    assert PR.searched(0.85) == 0.85 == PR.shown(0.85)
    assert (BYTES.tag(0.15), PR.tag(0.875)) == ("bytes15", "pr87.5")


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
