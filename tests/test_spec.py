"""The run spec (cmbench/spec.py) and the config-input hardening at the entrance.

Every refusal is one line, before any data or model is loaded; configs may name code (``_target_``),
but what a target makes is checked before it is called; records are strict JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from cmbench.api import compose_config
from cmbench.backbones.loading import build_backbone
from cmbench.cli.main import main
from cmbench.config_paths import CONFIG_DIR
from cmbench.errors import ConfigError
from cmbench.runs.records import RecordWriter, TaskRecord
from cmbench.spec import resolve_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail loudly if a run reaches its data or its backbone."""
    from cmbench.runs import evaluator, experiment

    def loaded(*args, **kwargs):
        raise AssertionError("the run loaded data or a model before refusing")

    monkeypatch.setattr(experiment, "build_adapter", loaded)
    monkeypatch.setattr(evaluator, "build_backbone", loaded)


def refused(tmp_path: Path, capsys, *args: str) -> str:
    """Run ``python -m cmbench run`` in this process; it must exit 1 with one line and create nothing."""
    out_dir = tmp_path / "runs"
    code = main(["run", f"out_dir={out_dir}", f"data.root={tmp_path / 'suite'}", "progress=false", *args])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("cmbench: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out_dir.exists()
    return err.strip()


@pytest.mark.parametrize("override, message", [
    ("generation.reindex_virtual_length=nan", "generation.reindex_virtual_length=nan: expected a finite number"),
    ("generation.reindex_virtual_length=0", "generation.reindex_virtual_length=0: expected a finite number > 0"),
    ("generation.reindex_recent=-1", "generation.reindex_recent=-1: expected a whole number >= 0"),
    ("generation.reindex_recent=true", "generation.reindex_recent=True: expected a whole number >= 0"),
    ("generation.continuation_frames=0", "generation.continuation_frames=0: expected a whole number >= 1, at most 4096"),
    ("generation.rope_reindex=2", "generation.rope_reindex=2: expected true or false"),
    ("generation.timesteps=[999,-5]", "generation.timesteps=[999, -5]: expected a list of numbers in (0, 1000]"),
    ("method.gamma=nan", "method.gamma=nan: expected a finite number"),
    ("method.gamma=inf", "method.gamma=inf: expected a finite number"),
    ("method.probe_step=true", "method decoprune: probe_step must be a whole number >= 0, got True"),
    ("data.fps=0", "data.fps=0: expected a finite number > 0"),
    ("data.fps=nan", "data.fps=nan: expected a finite number"),
    ("data.height=abc", "data.height='abc': expected a whole number >= 1"),
    ("scorer.min_box_size=nan", "scorer.min_box_size=nan: expected a finite number"),
    ("scorer.min_box_size=-1", "scorer.min_box_size=-1: expected a finite number >= 0"),
    ("scorer.batch_size=0", "scorer.batch_size=0: expected a whole number >= 1"),
    ("scorer.detector.score_threshold=inf", "scorer.detector.score_threshold=inf: expected a finite number"),
    ("scorer.reference_aggregation=median", "scorer.reference_aggregation='median': expected one of mean, max"),
    ("backbone.context.fps=0", "backbone.context.fps=0: expected a finite number > 0"),
    ("save_videos=3", "save_videos=3: expected true or false"),
    ("lossless_max_pixels=-1", "lossless_max_pixels=-1: expected a whole number >= 0"),
])
def test_a_bad_knob_of_any_group_is_one_line_before_anything_loads(tmp_path, capsys, nothing_loads, override,
                                                                    message):
    assert refused(tmp_path, capsys, override) == f"cmbench: error: {message}"


def test_a_malformed_method_knob_is_one_line(tmp_path, capsys, nothing_loads):
    err = refused(tmp_path, capsys, "method=random", "method.keep_counts=abc")
    assert err == ("cmbench: error: method 'random': keep_counts='abc': expected a mapping of chunk index to "
                   "tokens kept, e.g. {4: 10}")


def test_a_backbone_target_is_checked_before_it_is_called(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ConfigError, match="'os.system' is not a Backbone class nor a function annotated"):
        build_backbone({"name": "evil", "_target_": "os.system", "command": f"touch {marker}"})
    assert not marker.exists()
    with pytest.raises(ConfigError, match="'cmbench.scoring.boxes.masked_crop' is not a Backbone"):
        build_backbone({"name": "evil", "_target_": "cmbench.scoring.boxes.masked_crop"})


def test_the_shipped_backbone_config_builds_with_its_interpolations_resolved():
    from omegaconf import OmegaConf

    from cmbench.backbones.tiny import TinyWorldModel

    cfg = OmegaConf.load(CONFIG_DIR / "backbone" / "tiny.yaml")  # `${package_root:}` paths to the weights
    assert isinstance(build_backbone(cfg), TinyWorldModel)


def test_a_backbone_that_refuses_its_arguments_is_named_with_its_target_and_the_arguments(tmp_path):
    target = "cmbench.backbones.tiny.TinyWorldModel.from_pretrained"
    with pytest.raises(ConfigError) as err:
        build_backbone({"name": "mine", "_target_": target, "device": "cpu", "layers": 3, "paper": "doc only"})
    assert str(err.value).startswith(f"backbone 'mine': {target}(device, layers): ")
    assert "unexpected keyword argument 'layers'" in str(err.value)
    with pytest.raises(ConfigError, match=r"^backbone '\?': "):
        build_backbone({"_target_": target, "layers": 3})


def test_a_loader_that_returns_no_backbone_is_refused_by_name(monkeypatch):
    from cmbench.backbones import tiny
    from cmbench.backbones.tiny import TinyWorldModel  # noqa: F401 - the loader's declared return type

    def from_pretrained(cls, **kwargs) -> TinyWorldModel:  # declares a backbone, makes a string
        return "weights.bin"

    monkeypatch.setattr(tiny.TinyWorldModel, "from_pretrained", classmethod(from_pretrained))
    with pytest.raises(ConfigError, match=r"^backbone 'mine': cmbench\.backbones\.tiny\.TinyWorldModel\.from_pretrained "
                                          r"returned str, which does not implement"):
        build_backbone({"name": "mine", "_target_": "cmbench.backbones.tiny.TinyWorldModel.from_pretrained"})


def test_a_run_whose_backbone_yaml_names_os_system_runs_nothing(tmp_path, capsys, monkeypatch, nothing_loads):
    marker = tmp_path / "ran"
    (tmp_path / "configs" / "backbone").mkdir(parents=True)
    tiny = (CONFIG_DIR / "backbone" / "tiny.yaml").read_text()
    (tmp_path / "configs" / "backbone" / "evil.yaml").write_text(
        tiny.replace("cmbench.backbones.tiny.TinyWorldModel.from_pretrained", "os.system").replace(
            "name: tiny", "name: evil") + f"command: touch {marker}\n")
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp_path / "configs"))
    err = refused(tmp_path, capsys, "backbone=evil")
    assert "backbone 'evil': _target_ 'os.system' is not a Backbone class" in err and "refused without calling" in err
    assert not marker.exists()


def test_a_backbone_yaml_without_a_name_is_one_line(tmp_path, capsys, monkeypatch, nothing_loads):
    (tmp_path / "configs" / "backbone").mkdir(parents=True)
    tiny = (CONFIG_DIR / "backbone" / "tiny.yaml").read_text()
    (tmp_path / "configs" / "backbone" / "noname.yaml").write_text(tiny.replace("name: tiny\n", ""))
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp_path / "configs"))
    err = refused(tmp_path, capsys, "backbone=noname")
    assert err == "cmbench: error: backbone: the config has no name (add `name: <file name>` to its yaml)"


def test_ls_names_a_malformed_yaml_and_lists_the_rest(tmp_path, capsys, monkeypatch):
    (tmp_path / "method").mkdir()
    broken = tmp_path / "method" / "broken.yaml"
    broken.write_text("name: broken\n  gamma: [0.1\n")
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(tmp_path))
    assert main(["ls", "method"]) == 1
    out, err = capsys.readouterr()
    assert "decoprune" in out and "broken  " in out and "(unreadable yaml)" in out
    assert err.startswith(f"cmbench ls: error: {broken}: not a readable config (") and "Traceback" not in err


def test_a_config_folder_with_a_comma_is_refused_with_the_reason(tmp_path, capsys, monkeypatch, nothing_loads):
    folder = tmp_path / "my,configs"
    (folder / "method").mkdir(parents=True)
    monkeypatch.setenv("CMBENCH_CONFIG_PATH", str(folder))
    err = refused(tmp_path, capsys)
    assert f"CMBENCH_CONFIG_PATH: the folder '{folder}' contains ','" in err and "splits the path at ','" in err
    assert main(["ls"]) == 1
    assert "splits the path at ','" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="splits the path at ','"):
        compose_config("decoprune")


def test_the_documented_dict_form_of_a_plugin_method_resolves(tmp_path, monkeypatch):
    """``cmbench.evaluate(method={"_target_": "key_norm.KeyNorm", "k": 32})`` (docs/writing_a_method.md):
    named like an instance of its class, the same run directory as the instance."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "my_method"))
    from key_norm import KeyNorm

    overrides = [f"out_dir={tmp_path}", "limit=2"]
    by_dict = resolve_run(compose_config({"_target_": "key_norm.KeyNorm", "k": 32}, overrides))
    by_instance = resolve_run(compose_config(KeyNorm(k=32), overrides))
    assert by_dict.method_name == "key_norm" and isinstance(by_dict.method, KeyNorm) and by_dict.method.k == 32
    assert by_dict.run_dir == by_instance.run_dir and by_dict.run_dir.name.startswith("key_norm__tiny__light__")
    assert by_dict.identity.label == "key_norm@k=32"


def test_the_dict_form_without_name_or_target_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="a method config needs 'name'"):
        resolve_run(compose_config({"gamma": 0.2}, [f"out_dir={tmp_path}"]))


def test_the_spec_builds_the_method_once(tmp_path, monkeypatch):
    from cmbench.methods.decoprune import DeCoPrune

    built = []
    real_init = DeCoPrune.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(DeCoPrune, "__init__", counting)
    spec = resolve_run(compose_config("decoprune", [f"out_dir={tmp_path}", "method.gamma=0.2"]))
    assert len(built) == 1 and spec.method.gamma == 0.2
    assert spec.method_config["gamma"] == 0.2 and spec.identity.result_config["method"] == {"name": "decoprune",
                                                                                               "gamma": 0.2}
    assert spec.identity.label == "decoprune@gamma=0.2" and spec.selection.seed == 2
    assert spec.data.root == Path("data/miniworld") and spec.generation.continuation_frames == 16
    with pytest.raises(AttributeError):
        spec.selection.seed = 3  # type: ignore[misc]  # frozen


def test_records_are_strict_json(tmp_path):
    fields = {"task_id": "t", "status": "ok", "score": 0.5}
    with pytest.raises(ValueError, match=r"similarities\[1\]: is not a finite number \(records are strict JSON"):
        TaskRecord(**fields, similarities=[0.5, math.nan])
    with pytest.raises(ValueError, match=r"method_config.gamma: is not a finite number"):
        TaskRecord(**fields, method_config={"name": "decoprune", "gamma": math.inf})
    writer = RecordWriter(tmp_path / "records.jsonl")
    with pytest.raises(ValueError, match="is not a finite number"):
        writer.write({**fields, "similarities": [math.nan]})
    writer.write({**fields, "similarities": [0.5]})
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0], parse_constant=lambda c: pytest.fail(c))["similarities"] == [0.5]


def test_compare_records_reports_identical_and_differing_fields(tmp_path):
    import subprocess

    def write(folder: Path, score: float, seconds: float) -> None:
        run = folder / "miniworld" / "m__tiny__light__abc"
        run.mkdir(parents=True)
        row = {"task_id": "t1", "status": "ok", "label": "m", "score": score, "prefill_seconds": seconds,
               "recorded_ns": 1, "similarities": [score],
               "method_config": {"name": "m", "head_map": f"{folder}/cmbench/weights/head_map.json"}}
        (run / "records.jsonl").write_text(json.dumps(row) + "\n")

    write(tmp_path / "a", 0.5, 1.0)
    write(tmp_path / "b", 0.5, 9.0)  # a timing and the checkout's folder differ: not results
    write(tmp_path / "c", 0.25, 1.0)
    script = [sys.executable, str(ROOT / "scripts" / "compare_records.py")]
    same = subprocess.run([*script, str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert same.returncode == 0 and same.stdout.strip() == "m: identical (1 records)"
    differ = subprocess.run([*script, str(tmp_path / "a"), str(tmp_path / "c")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert differ.returncode == 1 and differ.stdout.strip() == "m: differs: t1: score, similarities"


def test_a_run_spec_takes_what_the_config_says_and_the_defaults_of_what_it_leaves_out():
    from omegaconf import open_dict

    cfg = compose_config("fullkv", ["score_source=mp4", "save_videos=false"])
    spec = resolve_run(cfg)
    assert (spec.score_source, spec.outputs.save_videos) == ("mp4", False)
    with open_dict(cfg):
        del cfg["score_source"], cfg["save_videos"]
    spec = resolve_run(cfg)
    assert (spec.score_source, spec.outputs.save_videos) == ("frames", True)


def test_a_storage_format_is_part_of_a_runs_identity_and_full_precision_hashes_as_before():
    from cmbench.spec import result_config

    fp, kivi = (resolve_run(compose_config("fullkv", extra)) for extra in ([], ["storage=kivi", "storage.bits=4"]))
    assert fp.run_dir != kivi.run_dir  # a quantized run never resumes a full-precision one
    plain = {"method": {"name": "fullkv"}, "storage": {"name": "kivi", "bits": 4}}
    assert result_config(plain)["storage"]["bits"] == 4
    assert "storage" not in result_config({"method": {"name": "fullkv"}, "storage": {"name": "fp"}})


def test_a_subset_of_another_world_is_refused_naming_the_world(tmp_path, capsys, nothing_loads):
    subset = tmp_path / "world3.txt"  # MiniWorld's tasks, drawn from world 3; the default world is 0
    subset.write_text("# dataset: miniworld\n# data.world_seed: 3\nsyn_001_reappear_01\n")
    err = refused(tmp_path, capsys, f"subset={subset}")
    assert err.startswith(f"cmbench: error: subset={subset} ({subset}) lists the tasks of another world: ")
