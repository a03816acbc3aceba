"""docs/writing_a_method.md runs exactly as printed: its files are examples/my_method/, its commands succeed
and print what the page shows (timings, measured FPS and run-directory hashes aside)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from cmbench.doc_examples import parse, run_session, stable, with_outputs

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "writing_a_method.md"
EXAMPLE = REPO / "examples" / "my_method"


@pytest.fixture(scope="module")
def page():
    return parse(GUIDE.read_text(), str(GUIDE))


def test_the_guide_prints_every_example_file_verbatim(page):
    shipped = sorted(str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    assert sorted(f.path for f in page.files) == shipped
    for printed in page.files:
        assert printed.text == (EXAMPLE / printed.path).read_text(), f"{printed.path} differs from {EXAMPLE}"


def test_the_example_config_and_package_name_the_module(page):
    target = yaml.safe_load((EXAMPLE / "configs/method/key_norm.yaml").read_text())["_target_"]
    module, cls = target.rsplit(".", 1)
    assert (EXAMPLE / f"{module}.py").is_file() and f"class {cls}(" in (EXAMPLE / f"{module}.py").read_text()
    modules = re.search(r'^py-modules = \[(.*)\]$', (EXAMPLE / "pyproject.toml").read_text(), re.M)
    assert modules is not None and modules.group(1) == f'"{module}"'  # what `pip install -e .` installs


def test_the_guide_declares_the_knob_calibrate_searches(page):
    """`calibrate`, `curves` and method.target_pr accept a method whose class declares `knob`."""
    import importlib.util

    from cmbench.calibration.matched_pr import method_knob

    spec = importlib.util.spec_from_file_location("key_norm", EXAMPLE / "key_norm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["key_norm"] = module
    try:
        spec.loader.exec_module(module)
        knob = method_knob({"_target_": "key_norm.KeyNorm"})
    finally:
        del sys.modules["key_norm"]
    assert (knob.name, knob.increasing, knob.integer) == ("k", False, True)
    assert "python -m cmbench calibrate method=key_norm target_pr=0.8" in GUIDE.read_text()


def test_the_guide_walks_the_whole_loop(page):
    lines = [c.line for c in page.commands]
    assert lines[0] == "export PYTHONPATH=$PWD CMBENCH_CONFIG_PATH=$PWD/configs"
    for step in ("cmbench ls method", "cmbench check method=key_norm", "cmbench run -m method=decoprune,key_norm",
                 "python evaluate.py", "key_norm.py", "cmbench leaderboard", "cmbench report"):
        assert any(step in line for line in lines), step
    sweep = next(line for line in lines if "cmbench run -m" in line)  # the comparison: each method's own rule
    assert "method.target_pr=0.8" in sweep and "quota" not in sweep  # at a matched PR, not under a quota
    silent = ("export ", "sed ")  # commands that print nothing
    assert all(c.output.strip() for c in page.commands if not c.line.startswith(silent)), "a command without its output"


@pytest.mark.slow
def test_the_guide_runs_as_printed_and_prints_what_it_shows(page, tmp_path):
    results = run_session(page, tmp_path / "my_method", sys.executable, pythonpath=str(REPO))
    assert [r.command for r in results] == [c.line for c in page.commands]
    for command, result in zip(page.commands, results):
        assert result.status == 0, f"`{command.line}` exited {result.status}:\n{result.output}"
        assert stable(result.output) == stable(command.output), (
            f"`{command.line}` printed something else than the page shows (rerun "
            f"scripts/update_doc_examples.py if the change is intended):\n{result.output}")
    # the edit reran every task, and the comparison against DeCoPrune is on the final board
    rerun = next(r for r in results if r.command.startswith("python -m cmbench run method=key_norm"))
    assert "2 task(s) recomputed" in rerun.output and "(2 run now, 0 cached)" in rerun.output
    sweep = next(r for r in results if r.command.startswith("python -m cmbench run -m"))
    before, after = (float(re.findall(r"key_norm@pr80: .*; light ([\d.]+),", r.output)[0])
                     for r in (sweep, rerun))
    assert after < before  # the page says the edit made the method worse
    board = next(r for r in results if r.command.startswith("python -m cmbench leaderboard")).output
    assert "| key_norm@pr80 | decoprune@pr80 |" in board and "| key_norm@pr80 | fullkv |" in board
    assert (tmp_path / "my_method/runs/miniworld/report/index.html").is_file()


# ---------------------------------------------------------------- the page runner itself

SMALL_PAGE = """Intro.

<!-- file: greet.sh -->
```sh
echo "hello $WHO"
```

```console
$ export WHO=world
$ sh greet.sh
hello world
$ echo 'took 3.2 s/task, 12s elapsed, runs/x__tiny__light__0123456789'
took 9.9 s/task, 1s elapsed, runs/x__tiny__light__abcdefabcd
$ false
```
"""


def test_a_session_runs_in_one_shell_and_reports_each_status(tmp_path):
    small = parse(SMALL_PAGE)
    assert [f.path for f in small.files] == ["greet.sh"] and [c.line for c in small.commands][1] == "sh greet.sh"
    results = run_session(small, tmp_path / "user", sys.executable)
    assert (tmp_path / "user/greet.sh").read_text() == 'echo "hello $WHO"\n'
    assert [(r.output, r.status) for r in results] == [
        ("", 0), ("hello world", 0), ("took 3.2 s/task, 12s elapsed, runs/x__tiny__light__0123456789", 0), ("", 1)]
    for command, result in zip(small.commands, results):  # timings and hashes are masked, text is not
        assert stable(command.output) == stable(result.output)
    assert stable("took 3.2 s/task, mean 0.41") != stable("took 3.2 s/task, mean 0.42")
    assert stable("1m34s elapsed, ~0s left") == stable("33s elapsed, ~1h02m left")  # a slower machine's minutes
    slow = ("m__tiny: 0/2 tasks (0 cached, 0 failed), mean score -; 2 to run, 0 cached\n"
            "m__tiny: 1/2 tasks (0 cached, 0 failed), mean score 0.9986, 95.8 s/task, 1m36s elapsed, ~1m36s left\n"
            "m__tiny: 2/2 tasks (0 cached, 0 failed), mean score 0.9957, 94.5 s/task, 3m09s elapsed, ~0s left; done")
    fast = "\n".join(line for i, line in enumerate(slow.splitlines()) if i != 1)
    assert stable(slow) == stable(fast) and len(stable(fast)) == 2  # a slow machine's interim line is left out
    assert stable(slow.replace("0.9957", "0.9958")) != stable(fast)  # the last line still counts
    rewritten = with_outputs(SMALL_PAGE, small, [r for r in results])
    assert "took 3.2 s/task, 12s elapsed" in rewritten and "took 9.9" not in rewritten
    assert parse(rewritten).files == small.files


def test_measured_fps_columns_are_masked_and_the_rest_of_a_table_is_not():
    shown = "| Method | Score | FPS speed-up | FPS |\n|---|---|---|---|\n| a | 0.50 | 2.0x* | 8.4 |"
    assert stable(shown) == stable(shown.replace("2.0x*", "3.1x*").replace("8.4", "9.9"))
    assert stable(shown) != stable(shown.replace("0.50", "0.51"))


def test_malformed_pages_are_named_with_their_line():
    with pytest.raises(ValueError, match=r"guide:2: code block never closed"):
        parse("x\n```console\n$ ls\n", "guide")
    with pytest.raises(ValueError, match=r"guide:2: a console block must start"):
        parse("```console\noutput first\n$ ls\n```\n", "guide")


def test_the_tiny_models_shapes_on_the_page_are_its_own():
    from cmbench.backbones.tiny import TinyWorldModel

    g = TinyWorldModel.from_pretrained().geometry
    line = (f"The tiny model: {g.num_layers} layers x {g.num_heads} heads, `D` = {g.head_dim}, `C` = "
            f"{g.latent_channels}, {g.latent_height} x {g.latent_width} latents, `T` = {g.tokens_per_frame}, "
            f"`L` = {g.tokens_per_chunk}.")
    assert line in " ".join(GUIDE.read_text().split())
    assert f"(`k=64` of {g.tokens_per_chunk} tokens per tiny chunk)" in " ".join(GUIDE.read_text().split())
