"""``python -m cmbench <command> key=value ...``: dispatch to the subcommand modules of :mod:`cmbench.cli`.

Every Hydra command takes overrides over ``configs/config.yaml`` (groups ``data/``, ``method/``,
``backbone/``, ``scorer/``, ``experiment/``); ``-m`` / ``--multirun`` sweeps work for ``run``.
"""

from __future__ import annotations

import sys

from cmbench.cli.base import COMMANDS, HELP_FLAGS, SWEEP_FLAGS, Command, run_hydra
from cmbench.errors import CMBenchError
from cmbench.registry import did_you_mean

# the keys every command that runs a model shares, each command listing the ones it reads
SELECTION = (("limit=N", "a seeded sample of N tasks, stratified by source and type (drawn with sample_seed=2)"),
             ("subset=NAME", "the tasks of a named subset (data_manifests/subsets/<name>.txt, or a path)"),
             ("task_ids=[ID,...]", "exactly these tasks"))
MODEL = (("data=NAME", "the dataset (default miniworld; cmbench: the official set at data.root=DIR)"),
         ("backbone=NAME", "the video model (default tiny; lingbot_world_v2_14b, lingbot_world_v2_1_3b, ...)"))
RUNS = (("runs=[DIR,...]", "run directories and score output folders (default: every run under <out_dir>/<data>/)"),
        ("data=NAME, out_dir=DIR", "whose runs/<data>/ is read by default (default miniworld, runs)"),
        ("leaderboard.focus=[LABEL,...]", "methods compared with every other on the board (default: each entry against FullKV)"),
        ("leaderboard.compare=[A,B]", "pairs compared as well ([[a,b],[c,d]] for several)"),
        ("leaderboard.allow_mixed=true", "report runs with different task sets, seeds or scorers together"),
        ("leaderboard.allow_suspect=true", "rank entries with suspect continuations (docs/scoring.md#continuity) too"),
        ("leaderboard.shared_tasks=true", "runs that ran different tasks: a board over the tasks all of them ran"),
        ("leaderboard.curves=PATH", "a curves.csv for the \"Score @ 85% PR\" column (default: one in the board's folder)"))
CALIBRATION = (("calibration.root=DIR", "calibration contexts, never the test suite (MiniWorld: a world of its own)"),
               ("calibration.tasks=N", "calibration tasks, a stratified seeded sample (default 4)"),
               ("calibration.tolerance=T", "stop once the calibration PR is this close to the target (default 0.005)"),
               ("calibration.max_probes=N", "most knob values measured (default 14)"))

for _command in (
    Command("run", "generate and score every task with one method (-m to sweep)", "cmbench.cli.run",
            description="Generates every selected task's continuation with one method and scores it, into "
                        "<out_dir>/<data>/<method>__<backbone>__<scorer>__<hash>/ (config.yaml, run.json, "
                        "records.jsonl, videos/, summary.json). Rerunning the same command skips finished tasks; "
                        "a -m sweep (method=a,b seed=2,3,4) ends with the leaderboard of its runs (docs/runs.md).",
            keys=(("method=NAME", "the method (default decoprune); its knobs as method.<knob>=VALUE"),
                  ("method.target_pr=P", "the method's own rule at its knob calibrated to pruning ratio P (once, "
                                         "then reused)"),
                  ("method.quota_pr=P", "a per-chunk quota that replaces the method's rule instead"),
                  *MODEL, ("scorer=NAME", "default light (CPU); owl_sam_dino is the paper's"), *SELECTION,
                  ("seed=N", "the global seed (default 2; the paper's are 2,3,4)"),
                  ("label=NAME", "the leaderboard name (default: the method and its changed knobs)"),
                  ("out_dir=DIR", "where run directories go (default runs)"),
                  ("shard.count=N shard.index=I", "this process's share of the contexts (default torchrun's "
                                                  "WORLD_SIZE / RANK, or a Slurm array's task)"),
                  ("shard.slurm_array=false", "a Slurm array that runs other settings per task, not shards"),
                  ("parallel.sequence=P", "one model split over P torchrun ranks (Ulysses sequence parallelism)"),
                  ("progress=false", "a line every progress_every=10 tasks or progress_seconds=60, not a bar"),
                  ("keep_other_code=true", "keep records computed by other code instead of recomputing them"),
                  ("save_videos=false", "save no videos of the continuations"),
                  ("threads=N", "torch CPU threads (default 1)"),
                  ("logging.wandb=PROJECT", "log each task and the run's summary to Weights & Biases "
                                            "(cmbench[tracking]; WANDB_MODE=offline keeps it local)"),
                  ("generation.KEY=VALUE", "the AR loop: continuation_frames=16, rope_reindex=true, timesteps, ..."),
                  ("-m", "sweep: one run per combination of comma-separated values"))),
    Command("leaderboard", "leaderboard CSVs, markdown and Pareto plot over runs", "cmbench.cli.leaderboard",
            description="Leaderboard CSVs (overall, per source, per task type, paired deltas vs FullKV), markdown "
                        "and a Pareto plot over run directories and score outputs, written whole or not at all. "
                        "Runs that differ only in seed are one row (docs/runs.md).",
            keys=(*RUNS, ("leaderboard.out=DIR", "where the reports go (default <out_dir>/<data>/leaderboard)"),
                  ("leaderboard.families=true", "also families.csv and .png: score vs device KV bytes by family, from the runs"),
                  ("leaderboard.refresh_curves=true", "refill only the \"Score @ 85% PR\" column of the board there"),
                  ("leaderboard.reference_aggregation=mean|max", "every score as that aggregation of its "
                                                                 "references' best scores"),
                  ("leaderboard.merge=[A.json,...]", "one board from received leaderboard.json files (no runs)"))),
    Command("report", "self-contained HTML report with per-task galleries over runs", "cmbench.cli.report",
            description="A self-contained HTML report (index.html and img/, nothing fetched) over the runs the "
                        "leaderboard reads: sortable tables, plots, and a per-task gallery of every method's "
                        "continuation (docs/report.md).",
            keys=(*RUNS, ("report.out=DIR", "where it goes (default <out_dir>/<data>/report)"),
                  ("report.title=TEXT", "the page's title"),
                  ("report.data_root=DIR", "where the runs' dataset is now, if it moved"),
                  ("report.screenshot=PNG", "also save a PNG of the page (headless Chromium)"),
                  ("report.screenshot_method=NAME", "... of this method's view of the gallery"))),
    Command("score", "score a folder of <task_id>.mkv / .mp4 continuations from any generator", "cmbench.cli.score",
            description="Scores every <task_id>.mkv / .mp4 under a folder (any generator's continuations) against "
                        "a dataset's tasks, writing the task records run writes (records.jsonl, summary.json, "
                        "config.yaml), so the leaderboard puts them beside run directories. Keep small videos "
                        "lossless (FFV1 .mkv): a lossy copy under 128 px a side scores differently.",
            keys=(("videos=DIR", "the continuations, searched recursively (required)"),
                  ("data=NAME", "the dataset whose tasks they continue (data.root=DIR)"),
                  ("scorer=NAME", "default light (CPU); owl_sam_dino is the paper's"),
                  ("out=DIR", "where the records go (default <videos>/scores_<scorer>)"),
                  ("label=NAME", "the name on a leaderboard (default the videos folder's)"),
                  ("threads=N", "torch CPU threads (default 1)"))),
    Command("validate", "check a manifest and its videos; list every problem", "cmbench.cli.validate",
            description="Checks a dataset's manifest, its videos and its named subsets, listing every problem as "
                        "file:line: field: what is wrong; exit 0 when clean.",
            keys=(("data=NAME", "the dataset (default miniworld)"), ("data.root=DIR", "where it is"),
                  ("data.manifest=FILE", "the manifest, relative to data.root"),
                  ("data.check_counts=false", "do not compare with the official counts (a subset)"))),
    Command("prepare", "build MiniWorld or fetch the official CMBench dataset", "cmbench.cli.prepare",
            description="Makes a dataset available, then validates it: data=miniworld builds the MiniWorld suite "
                        "(seconds, cached), data=cmbench fetches the official set (online only).",
            keys=(("data=NAME", "miniworld (default) or cmbench"), ("data.root=DIR", "where it goes"),
                  ("data.world_seed=N", "MiniWorld: another world (default 0)"),
                  ("data.revision=REV", "cmbench: the hub branch, tag or commit to download (default main); "
                                        "the commit is pinned"))),
    Command("verify", "recheck a received run: rescore its videos, recompute PR and bytes, compare code", "cmbench.cli.verify",
            hydra=False, synopsis="RUN [data.root=DIR] [tolerance=T]",
            description="Rechecks a run folder someone sent: scores its saved videos again with its scorer, "
                        "recomputes each record's PR and KV bytes from its ledger, and compares its code identities "
                        "and context videos with this checkout's; one line per difference, exit 1 when anything "
                        "differs (docs/runs.md, \"Submitting a board\").",
            keys=(("RUN", "the run folder (required)"),
                  ("data.root=DIR", "the run's dataset on this machine (default: the folder its config names)"),
                  ("tolerance=T", "how far a rescored score may be from the recorded one (default 1e-6)"))),
    Command("ls", "list what is registered in each config group", "cmbench.cli.ls", hydra=False,
            synopsis="[group ...]",
            description="Lists the options of each config group, one line each, with its description (every "
                        "group when none is named), including configs in CMBENCH_CONFIG_PATH folders.",
            keys=(("group", "data, method, backbone, scorer, storage or experiment (several allowed)"),)),
    Command("check", "check a method against the method contract on a random tiny model", "cmbench.cli.check",
            description="Checks a method (built-in or your own) against the method contract in seconds on a random "
                        "tiny model: provenance, determinism, decisions only, PR accounting, budgets; one line "
                        "per check, exit 1 when any fails (docs/writing_a_method.md).",
            keys=(("method=NAME", "the method checked; its knobs as method.<knob>=VALUE"),
                  ("check.seed=N", "the random model's and data's seed (default 0)"),
                  ("check.context_chunks=N", "context chunks prefilled (default 6)"),
                  ("check.continuation_chunks=N", "chunks generated (default 4)"))),
    Command("calibrate", "find a method's own knob value for a target PR on calibration contexts", "cmbench.cli.calibrate",
            description="Finds the value of a method's own knob (DeCoPrune's gamma, TempDiff's and ForcingKV's k, "
                        "Streaming's recent_chunks) that gives target_pr on calibration contexts, printing each "
                        "probe; writes <out_dir>/calibration/method/<method>_pr<t>.yaml and the search log, and "
                        "prints the run line that uses it. The same calibration is reused; another one (other "
                        "tasks, data, knobs, code) is made anew, saying which setting differs (docs/matched_pr.md).",
            keys=(("method=NAME", "the method (default decoprune)"),
                  ("target_pr=P", "the pruning ratio to calibrate to (required)"), *CALIBRATION,
                  ("sample_seed=N", "the seeded sample of calibration tasks (default 2)"), *MODEL,
                  ("out_dir=DIR", "<out_dir>/calibration/ keeps the results (default runs)"))),
    Command("curves", "score vs PR: calibrate each method to several PRs, run, plot, area under the curve",
            "cmbench.cli.curves",
            description="Score vs PR: calibrates each method to each target PR, runs it on the suite (resumable, "
                        "under <out_dir>/curves/<data>/) and FullKV once, then writes curves.csv, auc.csv and "
                        "curves.png into the leaderboard's folder, whose board then shows \"Score @ 85% PR\" "
                        "(docs/matched_pr.md).",
            keys=(("methods=[A,B,...]", "the methods (default every method with a knob)"),
                  ("target_prs=[P,...]", "the target pruning ratios (default [0.75,0.80,0.85,0.90,0.95])"),
                  *SELECTION, *CALIBRATION, *MODEL, ("scorer=NAME", "default light; owl_sam_dino is the paper's"),
                  ("leaderboard.out=DIR", "where the curves go (default <out_dir>/<data>/leaderboard)"),
                  ("out_dir=DIR", "default runs"))),
    Command("diagnose", "x0 error per context chunk and denoising step: full cache, method's cache, no history",
            "cmbench.cli.diagnose",
            description="The paper's motivating observation: for every context chunk of the selected tasks' "
                        "contexts and every denoising step, the error of the x0 prediction under the full cache, "
                        "the method's cache and no history, split on MiniWorld by whether what the chunk shows is "
                        "still cached, was pruned, or is new. Writes diagnose.csv, diagnose_summary.csv, "
                        "diagnose.png and diagnose.md (the verdict) into out, printing a line per context with the "
                        "time so far and the time left (docs/findings.md).",
            keys=(("method=NAME", "the method whose cache is diagnosed (default decoprune)"),
                  ("method.target_pr=P", "... at its knob calibrated to pruning ratio P"),
                  ("experiment=paper_diagnose", "the paper's setup: DeCoPrune on MiniWorld's miniworld_diagnostic8"),
                  ("limit=N", "the contexts of a seeded sample of N tasks (stratified, sample_seed=2); default all"),
                  *SELECTION[1:], *MODEL, ("seed=N", "the probes' noise (default 2)"),
                  ("out=DIR", "where the outputs go (default <out_dir>/<data>/diagnose/<label>)"))),
    Command("plan", "predicted device memory per phase and the offloads a run would use", "cmbench.cli.plan",
            description="Predicts the peak device memory of each phase of a run (weights, text encoder, VAE, "
                        "prefill cache, fork, activations, scorer) before anything is loaded, the offloads run "
                        "would use, and whether it fits the reference machines; exit 1 when it does not fit "
                        "(docs/real_backbones.md).",
            keys=(("backbone=NAME", "the model (lingbot_world_v2_14b, lingbot_world_v2_1_3b, ...)"),
                  ("method=NAME", "the method whose cache is sized (default decoprune)"),
                  ("method.quota_pr=P", "quota mode: exactly this PR"),
                  ("method.target_pr=P", "the PR the method's own rule is sized for (as backbone.memory.assume_pr)"),
                  ("data=NAME", "its contexts' length (data=cmbench: one minute)"),
                  ("scorer=NAME", "owl_sam_dino shares the GPU; light runs on the CPU"),
                  ("parallel.sequence=P", "one rank's memory of a model split over P GPUs"),
                  ("generation.continuation_frames=N", "latent frames per task (default 16)"),
                  ("backbone.memory.device_gib=G", "the device to plan for (default this GPU's; none: 139, an H200)"),
                  ("backbone.memory.host_gib=G", "the host memory for offloads (default this machine's)"),
                  ("backbone.memory.reserve_gib=G", "device memory kept free (default 8)"),
                  ("backbone.memory.context_seconds=S", "the context length (default the data's longest, else 60)"),
                  ("backbone.memory.assume_pr=P", "the PR a data-dependent rule is sized for (default the "
                                                   "paper's realised PR)"),
                  ("backbone.memory.offloads=off", "plan exactly as configured (default auto: the cheapest that "
                                                   "fits)"))),
):
    COMMANDS.add(_command.name, _command)

USAGE = """usage: python -m cmbench <command> [key=value ...] [-m]

commands:
{commands}

`python -m cmbench <command> --help` says what a command does and lists its keys.

examples:
  python -m cmbench run method=decoprune limit=8
  python -m cmbench validate data=cmbench data.root=/path/to/CMBench
  python -m cmbench ls method
"""


def usage() -> str:
    names = COMMANDS.names()
    width = max(map(len, names))
    return USAGE.format(commands="\n".join(f"  {n.ljust(width)}  {COMMANDS.get(n).help}" for n in names))


INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
FAILED_TASKS = 3  # run's status when some task failed (its run and the others' records are written)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (:data:`INTERRUPTED` after Ctrl-C, with one line: a
    run's says how many records it kept)."""
    try:
        return _main(argv)
    except KeyboardInterrupt as err:
        print(f"cmbench: {str(err) or 'interrupted'}", file=sys.stderr)
        return INTERRUPTED


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        hint = did_you_mean(name, COMMANDS.names())
        print(f"cmbench: unknown command {name!r}.{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    command = COMMANDS.get(name)
    if set(HELP_FLAGS) & set(rest):  # the command's own help, before anything is imported or composed
        print(command.usage())
        return 0
    execute = command.function()
    if execute is None:
        raise RuntimeError(f"command module {command.module} has no execute function")
    if not command.hydra:
        return int(execute(rest))
    jobs = run_hydra(execute, rest)
    code = max((job.code for job in jobs), default=0)
    after_sweep = command.function("after_sweep")
    # the board of the jobs that ran (a job whose tasks failed, exit 3, still wrote its run), not of one refused
    configs = [job.cfg for job in jobs if job.cfg is not None and job.code in (0, FAILED_TASKS)]
    if after_sweep is not None and set(SWEEP_FLAGS) & set(rest) and configs:
        try:
            code = max(code, int(after_sweep(configs)))
        except CMBenchError as err:
            print(f"cmbench: {name}: {err}", file=sys.stderr)
            code = max(code, 1)
    return code
