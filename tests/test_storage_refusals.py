"""A storage format the command line cannot have is refused in one line before anything is made: a format
no config folder holds (``storage=nope``), a knob the format lacks (``storage=kivi storage.stages=2``,
``storage=fp storage.bits=2``), and a merging method in a quantized format (``method=tempcache storage=kivi``,
with or without a bytes target: a run folder and a calibration folder alike)."""

from __future__ import annotations

import pytest

from cmbench.cli.main import main


def refusal(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err  # one line, not Hydra's list of options and search path
    return err[0]


@pytest.mark.parametrize("command", ["run", "calibrate"])
@pytest.mark.parametrize("overrides, said", [
    (["storage=nope"], "cmbench: error: storage=nope: no storage config of that name; choose one of chunkmean, fp, "
                       "kivi, "),
    (["storage=kivi", "storage.stages=2"], "cmbench: error: storage.stages=2: kivi quantizes in one stage"),
    (["storage=fp", "storage.bits=2"], "cmbench: error: storage.bits=2: full precision (storage=fp) has no knobs"),
    (["method=tempcache", "storage=kivi"], "cmbench: error: method tempcache merges history rows"),
    (["method=tempcache", "storage=qvg", "method.target_bytes=0.1"], "cmbench: error: method tempcache merges history "
                                                                     "rows (a count-weighted mean of values, which needs "
                                                                     "them in full precision): storage=qvg"),
])
def test_an_impossible_storage_choice_is_one_line_before_any_folder(tmp_path, capsys, command, overrides, said):
    if command == "calibrate":
        overrides = [o.replace("method.target_bytes", "target_bytes") for o in overrides]
        overrides += [] if any(o.startswith("target_bytes") for o in overrides) else ["target_pr=0.5"]
        overrides += [] if any(o.startswith("method=") for o in overrides) else ["method=streaming"]
    out = tmp_path / "runs"
    code = main([command, *overrides, f"out_dir={out}", f"data.root={tmp_path / 'suite'}", "limit=1"])
    assert code != 0 and refusal(capsys).startswith(said)
    assert not out.exists() and not (tmp_path / "suite").exists()


def test_a_sweep_naming_one_unknown_format_is_refused_naming_it(tmp_path, capsys):
    assert main(["run", "-m", "storage=kivi,nope", f"out_dir={tmp_path}/runs", "limit=1"]) != 0
    assert refusal(capsys).startswith("cmbench: error: storage=nope: no storage config of that name")


def test_a_merging_method_in_full_precision_and_a_quantized_eviction_method_are_accepted():
    from cmbench.cache.quantized import StorageFormat
    from cmbench.methods.registry import method_class
    from cmbench.spec import check_format_for_method

    check_format_for_method(method_class("tempcache"), StorageFormat())
    check_format_for_method(method_class("decoprune"), StorageFormat("kivi"))
    with pytest.raises(Exception, match="tempcache merges history rows"):
        check_format_for_method(method_class("tempcache"), StorageFormat("kivi"))
