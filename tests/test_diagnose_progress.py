"""``python -m cmbench diagnose`` shows where it is: a line per context with the time so far and the time
left, estimated from the contexts done (as ``run``'s progress lines), and a last line with the total."""

from __future__ import annotations

from cmbench.cli import diagnose
from cmbench.cli.main import main
from cmbench.errors import ConfigError


def test_each_context_line_says_the_time_so_far_and_what_is_left(capsys):
    now = iter([0.0, 0.0, 60.0, 150.0, 240.0])
    shown = diagnose.ContextProgress(clock=lambda: next(now))
    for done, context in enumerate(["a", "b", "c"]):
        shown(done, 3, context)
    shown.finish(3)
    assert capsys.readouterr().out.splitlines() == [
        "[1/3] a: 0s elapsed",
        "[2/3] b: 1m00s elapsed, ~2m00s left",
        "[3/3] c: 2m30s elapsed, ~1m15s left",
        "diagnosed 3 contexts in 4m00s",
    ]


def test_the_command_prints_them(tmp_path, monkeypatch, capsys):
    """The command hands its progress to the diagnosis (stopped here after its contexts: no model runs)."""

    def contexts_then_stop(spec, on_context=None):
        for done, context in enumerate(["videos/synthetic/syn_001", "videos/synthetic/syn_002"]):
            on_context(done, 2, context)
        raise ConfigError("stopped by the test")

    monkeypatch.setattr(diagnose, "run_diagnosis", contexts_then_stop)
    assert main(["diagnose", f"out_dir={tmp_path}", "limit=2"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[1/2] videos/synthetic/syn_001: 0s elapsed"
    assert out[1].startswith("[2/2] videos/synthetic/syn_002: ") and out[1].endswith(" left")


def test_the_diagnosis_draws_the_runs_task_sample(tmp_path, monkeypatch):
    """``limit=N`` draws the same N tasks as ``run`` does with the same ``sample_seed`` (stopped once drawn)."""
    import cmbench.data
    import cmbench.data.adapter
    import cmbench.runs.runner

    drawn = {}

    class NoData:
        def ensure(self):
            return tmp_path

    def drawn_then_stop(tasks, task_ids=None, limit=None, seed=None):
        drawn.update(task_ids=task_ids, limit=limit, seed=seed)
        raise ConfigError("stopped by the test")

    monkeypatch.setattr(cmbench.data.adapter, "build_adapter", lambda cfg: NoData())
    monkeypatch.setattr(cmbench.data, "load_manifest", lambda root, manifest: [])
    monkeypatch.setattr(cmbench.runs.runner, "select_tasks", drawn_then_stop)
    assert main(["diagnose", f"out_dir={tmp_path}", "limit=3", "sample_seed=11"]) == 1
    assert drawn == {"task_ids": None, "limit": 3, "seed": 11}
