"""Every command's ``--help`` (and ``-h``) says what the command does and lists its keys, one line each,
and exits 0 without composing a config or writing anything: never Hydra's generic help."""

from __future__ import annotations

import re

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cmbench.cli.main import COMMANDS, main
from cmbench.config_paths import CONFIG_DIR, GROUPS

# the keys each command's help must list at least (a new command must add its own here)
MAIN_KEYS = {
    "run": ["method=NAME", "method.target_pr=P", "data=NAME", "limit=N", "seed=N", "label=NAME", "-m"],
    "leaderboard": ["runs=[DIR,...]", "leaderboard.out=DIR", "leaderboard.focus=[LABEL,...]"],
    "report": ["runs=[DIR,...]", "report.out=DIR", "report.screenshot=PNG"],
    "score": ["videos=DIR", "data=NAME", "scorer=NAME", "out=DIR", "label=NAME"],
    "validate": ["data=NAME", "data.root=DIR", "data.check_counts=false"],
    "prepare": ["data=NAME", "data.root=DIR"],
    "ls": ["group"],
    "verify": ["RUN", "data.root=DIR", "tolerance=T"],
    "check": ["method=NAME", "check.context_chunks=N"],
    "calibrate": ["method=NAME", "target_pr=P", "calibration.tasks=N", "calibration.root=DIR"],
    "curves": ["methods=[A,B,...]", "target_prs=[P,...]", "limit=N"],
    "diagnose": ["method=NAME", "limit=N", "subset=NAME", "experiment=paper_diagnose", "out=DIR"],
    "plan": ["backbone=NAME", "method=NAME", "method.quota_pr=P", "method.target_pr=P", "backbone.memory.device_gib=G",
             "backbone.memory.assume_pr=P"],
}


def test_every_command_has_its_main_keys_listed_here():
    assert sorted(MAIN_KEYS) == sorted(COMMANDS.names())


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("name", sorted(COMMANDS.names()))
def test_a_commands_help_says_what_it_does_and_its_keys(tmp_path, monkeypatch, capsys, name, flag):
    monkeypatch.chdir(tmp_path)
    assert main([name, "method=fullkv", flag]) == 0
    out, err = capsys.readouterr()
    command = COMMANDS.get(name)
    assert out.startswith(f"usage: python -m cmbench {name} ") and err == ""
    assert " ".join(command.description.split()[:8]) in " ".join(out.split())
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert [key for key in MAIN_KEYS[name] if key not in listed] == []
    assert "Powered by Hydra" not in out and "== Config ==" not in out and "Compose your configuration" not in out
    assert list(tmp_path.iterdir()) == []  # nothing composed, nothing run


DATASET_KEYS = {key for path in (CONFIG_DIR / "data").glob("*.yaml") for key in yaml.safe_load(path.read_text())}
"""The keys some dataset config defines (``data.revision``: the official set's, not the default MiniWorld's)."""


def test_a_key_in_the_help_is_a_key_of_the_config():
    """Each listed ``a.b=VALUE`` names a config group or a key of the default config (placeholders,
    knobs of a method or backbone and the keys a command adds aside)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config")
    missing = []
    for name in COMMANDS.names():
        command = COMMANDS.get(name)
        if not command.hydra:
            continue
        for key, _ in command.keys:
            for path in re.findall(r"([\w.]+)=", key):
                if path in GROUPS or path.split(".")[0] in ("method", "backbone", "generation"):
                    continue
                if path.startswith("data.") and path.split(".", 1)[1] in DATASET_KEYS:  # another dataset's own
                    continue
                if OmegaConf.select(cfg, path, default="<missing>") == "<missing>":
                    missing.append(f"{name}: {path}")
    assert missing == []


def test_the_list_of_commands_points_at_their_help(capsys):
    assert main(["--help"]) == 0
    assert "python -m cmbench <command> --help" in capsys.readouterr().out


def test_ls_lists_the_storage_formats(capsys):
    """``storage=`` is chosen like any group, so ``ls storage`` lists its formats and plain ``ls`` includes them."""
    assert main(["ls", "storage"]) == 0
    out, err = capsys.readouterr()
    formats = sorted(p.stem for p in (CONFIG_DIR / "storage").glob("*.yaml"))
    assert err == "" and out.startswith(f"storage/ ({len(formats)})") and {"fp", "kivi"} <= set(formats)
    assert [name for name in formats if not re.search(rf"^  {name} +\S", out, re.M)] == []
    assert main(["ls"]) == 0 and "\nstorage/ (" in capsys.readouterr().out
