"""The README's findings, quality, families, kvpress and retrieval paragraphs, generated from the committed records and CSVs
(the boards' verdicts from their verdict CSVs, :mod:`cmbench.report.verdicts`).

``python scripts/update_readme_results.py`` writes them between their markers in README.md
(``<!-- findings -->``, ``<!-- quality -->``, ``<!-- families -->``, ``<!-- kvpress -->``, ``<!-- retrieval -->``); ``tests/test_readme_results.py`` fails
when the README says anything the committed files do not.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cmbench.paper.findings import Finding, page, summary_lines
from cmbench.report import verdicts
from cmbench.report.board_claims import KVPRESS_DECOPRUNE, KVPRESS_RANDOM, top_and_runner_up
from cmbench.report.families import LANDING_TOLERANCE, board_axis, entry_families, memory_columns
from cmbench.report.verdicts import said, top_words

FINDINGS = (Path("results/paper/world0"), Path("results/paper/world2"))
"""The committed records behind the findings table: the reference world, then the second world."""
TABLE = Path("results/paper_findings.md")

QUALITY = Path("results/miniworld/quality_vs_memory.csv")
REFERENCE = Path("results/miniworld/curves_reference.csv")
NAMES = {"light": "memory (light)", "temporal_flickering": "temporal flickering (camera motion here)",
         "subject_consistency_light": "subject consistency (light)",
         "background_consistency_light": "background consistency (light)"}
FAMILIES_BOARD = Path("results/miniworld/families_bytes.csv")
FAMILIES_PAIRS = Path("results/miniworld/families_bytes_comparisons.csv")
FAMILIES_VERDICTS = Path("results/miniworld/families_bytes_verdicts.csv")
FAMILIES_SUBSET = "`miniworld_contexts32` (one task from each of 32 contexts)"
"""The tasks the committed families comparison ran (scripts/families_bytes.sh, results/miniworld/families_bytes.md)."""
RETRIEVAL = (Path("results/miniworld/retrieval_comparison.csv"),
             Path("results/miniworld/retrieval_comparison_worldkv_rules.csv"))
"""The committed retrieval comparison: the fixed-window reading and the eviction methods, then WorldKV's own rule."""
RETRIEVAL_VERDICTS = (Path("results/miniworld/retrieval_comparison_verdicts.csv"),
                      Path("results/miniworld/retrieval_comparison_worldkv_rules_verdicts.csv"))
"""Each retrieval table's verdicts (``scripts/retrieval_comparison.py --verdicts``, from the committed records)."""
KVPRESS_BOARD = Path("results/miniworld/kvpress_leaderboard.csv")
KVPRESS_PAIRS = Path("results/miniworld/kvpress_comparisons.csv")
KVPRESS_VERDICTS = Path("results/miniworld/kvpress_verdicts.csv")
RESULT_TABLES = {"miniworld": Path("results/miniworld/leaderboard.md"), "pr_at_scale": Path("results/pr_at_scale.md"),
                 "speed": Path("results/bench_speed_768.md")}
"""The tables the README carries as written by a script, by their block's marker (``<!-- results:<marker> -->``): the
reference leaderboard (``scripts/reproduce_results.sh``), the PR at the paper's scale (``scripts/pr_at_scale.py``) and
the speed benchmark at 768 frames (``scripts/bench_speed.py``)."""
MARKERS = {"findings": ("<!-- findings -->", "<!-- /findings -->"), "quality": ("<!-- quality -->", "<!-- /quality -->"),
           "families": ("<!-- families -->", "<!-- /families -->"), "kvpress": ("<!-- kvpress -->", "<!-- /kvpress -->"),
           "retrieval": ("<!-- retrieval -->", "<!-- /retrieval -->")}


def committed_page() -> tuple[str, list[Finding], list[Finding] | None]:
    """results/paper_findings.md as the committed records give it (run from the repository's root: the page
    names the records' folders relative to it)."""
    reference, second = FINDINGS
    return page(reference, second=second)


def findings_block(findings: list[Finding], second: list[Finding] | None) -> str:
    """One line per finding: verdicts of both worlds and why, as the findings table says them."""
    return summary_lines(findings, second)


def quality_block(root: Path) -> str:
    """The quality-beside-memory table from ``results/miniworld/quality_vs_memory.csv`` (relative to FullKV,
    over the calibrated curves' points) with FullKV's own values from the reference curves."""
    band = pd.read_csv(root / QUALITY)
    full = pd.read_csv(root / REFERENCE).set_index("method").loc["fullkv"]
    memory = band[band["kind"] == "memory"].iloc[0]
    quality = band[band["kind"] == "quality"]
    lines = [
        f"Over PR {memory['pr_low']:g}-{memory['pr_high']:g} ({int(memory['points'])} calibrated points of the "
        f"curves, `{QUALITY}`; FullKV: memory {full['score']:.3f}, flickering {full['temporal_flickering']:.3f}, "
        f"subject {full['subject_consistency_light']:.3f}, background {full['background_consistency_light']:.3f}, "
        f"`{REFERENCE}`):",
        "",
        "| metric | lowest / highest, relative to FullKV | range |",
        "|---|---|---|",
    ]
    for _, row in band.iterrows():
        width = f"{row['range_vs_fullkv']:.3f}"
        lines.append(f"| {NAMES.get(row['metric'], row['metric'])} | {row['min_vs_fullkv']:.3f} / "
                     f"{row['max_vs_fullkv']:.3f} | {f'**{width}**' if row['kind'] == 'memory' else width} |")
    widest = quality.loc[quality["range_vs_fullkv"].idxmax()]
    narrow = quality[quality["range_vs_fullkv"] < widest["range_vs_fullkv"]]
    lines += ["", f"Memory falls to {memory['min_vs_fullkv']:.3f} of FullKV while "
              + (", ".join(NAMES.get(m, m) for m in narrow["metric"]) + " move by at most "
                 + f"{narrow['range_vs_fullkv'].max():.3f}" + " and " if len(narrow) else "")
              + f"{NAMES.get(widest['metric'], widest['metric'])} by {widest['range_vs_fullkv']:.3f}."]
    return "\n".join(lines)


def families_block(root: Path) -> str:
    """Every entry of the families comparison by bytes target: its family, the device bytes it stored, its score,
    FullKV minus it (paired), what the verdict rule says of it against FullKV, and its continuation's PSNR against
    FullKV's; then, per target, the best entry or the unresolved top group and what each entry is against FullKV
    (from the board's verdict CSV, :mod:`cmbench.report.board_claims`; the rule is stated in the block)."""
    board = pd.read_csv(root / FAMILIES_BOARD)
    pairs = pd.read_csv(root / FAMILIES_PAIRS)
    decided = verdict_rows(root, FAMILIES_VERDICTS)
    full = board.set_index("method").loc["fullkv"]
    rows = memory_columns(board)
    rows = rows[rows["method"] != "fullkv"].copy()
    rows["family"] = entry_families(rows)
    rows["on_target"] = rows["on_target"].astype(bool)
    # the formats alone (no target) after the targets, then the entries off their targets (not ranked)
    rows["order"] = rows["bytes_target"].fillna(-1.0).where(rows["on_target"], -2.0)
    rows = rows.sort_values(["order", "score"], ascending=[False, False], kind="stable")
    seeds = int(full["seeds"])
    lines = [f"{int(full['n_tasks'])} (task, seed) pairs: the {int(full['n_tasks']) // seeds} tasks of "
             f"{FAMILIES_SUBSET} x {seeds} seed{'s' if seeds > 1 else ''} (`{FAMILIES_BOARD}`, paired deltas "
             f"`{FAMILIES_PAIRS}`, commands `scripts/families_bytes.sh`). Each knob is calibrated to its bytes target "
             f"on 2 calibration tasks; *device bytes* is what the entry stored on the test tasks, {board_axis(board)}; "
             f"an entry whose device bytes miss its target by more than {100 * LANDING_TOLERANCE:g}% of it is shown off "
             "target and not ranked there. "
             f"FullKV scores {full['score']:.3f} ± {full['score_ci95']:.3f}. " + family_sentence(decided)
             + f": an entry is **level with FullKV** only when that interval of its difference lies within "
               f"±{margin(decided):g} (absence of evidence is never level), and **best** only where its lead over the "
               "runner-up holds, else the two are a top group (not resolved).", "",
             "| target | entry | family | device bytes | score | FullKV − entry (p) | against FullKV | PSNR vs FullKV |",
             "|---|---|---|---|---|---|---|---|"]
    against: dict[tuple[float, str], list[str]] = {}  # (order, words against FullKV) -> entries
    for row in rows.itertuples():
        delta = difference(pairs, "fullkv", row.method)
        target = "format alone" if pd.isna(row.bytes_target) else f"{row.bytes_target:g}" + ("" if row.on_target else " (off)")
        words = said(decided[(row.method, "fullkv")], "FullKV")
        lines.append(f"| {target} | {row.method} | {row.family} | {row.device_bytes_ratio:.3f} | "
                     f"{row.score:.3f} ± {row.score_ci95:.3f} | {delta} | {words} | {row.psnr_vs_fullkv:.1f} dB |")
        against.setdefault((row.order, words), []).append(row.method)
    lines.append("")
    for target, group in rows.groupby("order", sort=False):
        if target == -2.0:
            lines.append("- Off their targets (not ranked): " + ", ".join(
                f"{r.method} ({r.device_bytes_ratio:.3f} at {r.bytes_target:g}, {100 * r.bytes_miss:+.0f}%)"
                for r in group.itertuples()) + ".")
            continue
        by_method = group.set_index("method")
        named, runner_name, same = top_and_runner_up(list(by_method.index), pairs)
        top = by_method.loc[named]
        runner = None if runner_name is None else f"{runner_name} {by_method.loc[runner_name, 'score']:.3f}"
        lead = None if runner_name is None else decided.get((named, runner_name))
        twice = f" (scored the same on every task and seed: {', '.join(same)})" if same else ""
        head = top_words(f"{named} ({top['family']}) {top['score']:.3f}{twice}", runner,
                         None if lead is None else str(lead["verdict"]))
        groups = [f"{w}: {', '.join(entries)}" for (order, w), entries in against.items() if order == target]
        where = "The formats alone" if target < 0 else f"At {target:g} of FullKV's bytes"
        lines.append(f"- {where}: {head}; " + "; ".join(groups) + ".")
    return "\n".join(lines)


def retrieval_block(root: Path) -> str:
    """The retrieval comparison at its tightest device budget: each method's device PR, score, device KV, host store
    and bytes moved per chunk (``results/miniworld/retrieval_comparison*.csv``), FullKV's score beside, and what the
    verdict rule says of each retrieval method against FullKV and against DeCoPrune at that budget (each table's
    verdict CSV, its claims one family: :func:`cmbench.report.board_claims.retrieval_verdicts`; a method both tables
    hold is read from the first)."""
    tables = [pd.read_csv(root / path) for path in RETRIEVAL]
    full = tables[0].set_index("method").loc["fullkv"]
    rows = pd.concat(tables).drop_duplicates(["method", "target_pr"])
    rows = rows[(rows["method"] != "fullkv") & (rows["target_pr"] == rows["target_pr"].max())]
    target = float(rows["target_pr"].iloc[0])
    decided = [verdict_rows(root, path) for path in RETRIEVAL_VERDICTS]
    said_of: dict[tuple[str, str], str] = {}
    for table in reversed(decided):  # the first table's reading wins
        said_of.update({(a, b): said(row, "FullKV" if b == "fullkv" else "DeCoPrune") for (a, b), row in table.items()})
    families = "; ".join(f"`{path}`: {int(next(iter(d.values()))['family_size'])} claims at level "
                         f"{float(next(iter(d.values()))['level']):.2%}" for path, d in zip(RETRIEVAL_VERDICTS, decided))
    lines = [f"At a matched {target:.0%} device PR on the {int(full['n_tasks'])} tasks of `miniworld_quick16` ("
             f"FullKV {full['score']:.3f} with {full['peak_kv_mb']:.1f} MB of device KV; "
             + ", ".join(f"`{path}`" for path in RETRIEVAL) + "). Verdicts (docs/verdicts.md): each table's claims "
             f"(every retrieval method level with FullKV, and ahead of DeCoPrune at the same target where the table "
             f"has DeCoPrune) are one family, read off Bonferroni-simultaneous intervals ({families}); **level** only "
             f"where the interval lies within ±{margin(decided[0]):g}.", "",
             "| method | device PR | score | device KV (MB) | host store (MB) | moved per chunk (MB) | against FullKV | "
             "against DeCoPrune |", "|---|---|---|---|---|---|---|---|"]
    for r in rows.sort_values("score", ascending=False, kind="stable").itertuples():
        store = "—" if pd.isna(r.peak_store_mb) else f"{r.peak_store_mb:.1f}"
        moved = "—" if pd.isna(r.moved_per_chunk_mb) else f"{r.moved_per_chunk_mb:.2f}"
        label = f"{r.method}@{r.target_pr:g}"
        against = [said_of.get((label, b), "—") for b in ("fullkv", f"decoprune@{r.target_pr:g}")]
        lines.append(f"| {r.method} | {r.device_pr:.3f} | {r.score:.3f} | {r.peak_kv_mb:.1f} | {store} | {moved} | "
                     f"{against[0]} | {against[1]} |")
    return "\n".join(lines)


def difference(pairs: pd.DataFrame, a: str, b: str) -> str:
    """``a - b`` from a comparisons table, read either way round: ``+0.010 ± 0.019 (0.24)`` (95% CI, p); "" when
    the table does not compare them."""
    for first, second, sign in ((a, b, 1), (b, a, -1)):
        rows = pairs[(pairs["method"] == first) & (pairs["versus"] == second)]
        if len(rows):
            row = rows.iloc[0]
            return f"{sign * row['delta']:+.3f} ± {row['delta_ci95']:.3f} ({row['p_value']:.2g})"
    return ""


def kvpress_block(root: Path) -> str:
    """The kvpress presses at a matched 85% PR: each press's score and PR, its paired difference from Random (at
    DeCoPrune's per-chunk counts) and from DeCoPrune, and what the verdict rule says of each (the board's verdict
    CSV, :func:`cmbench.report.board_claims.kvpress_claims`)."""
    board = pd.read_csv(root / KVPRESS_BOARD).set_index("method")
    pairs = pd.read_csv(root / KVPRESS_PAIRS)
    decided = verdict_rows(root, KVPRESS_VERDICTS)
    random_, deco, full = (board.loc[m] for m in (KVPRESS_RANDOM, KVPRESS_DECOPRUNE, "fullkv"))
    presses = board[board.index.str.startswith("kvpress_")].sort_values("score", ascending=False, kind="stable")

    seeds = int(full["seeds"])
    lines = [f"{int(full['n_tasks'])} (task, seed) pairs: the {int(full['n_tasks']) // seeds} tasks of "
             f"`miniworld_quick16` x {seeds} seeds, light scorer (`{KVPRESS_BOARD}`, paired deltas `{KVPRESS_PAIRS}`, "
             f"verdicts `{KVPRESS_VERDICTS}`). FullKV scores {full['score']:.3f}; Random at DeCoPrune's per-chunk "
             f"counts {random_['score']:.3f} at PR {random_['pr']:.2%}; DeCoPrune {deco['score']:.3f} at PR "
             f"{deco['pr']:.2%}; every press at PR {presses['pr'].min():.2%}"
             + ("" if presses["pr"].nunique() == 1 else f"-{presses['pr'].max():.2%}")
             + " (the count per chunk does not depend on the press). " + family_sentence(decided)
             + f": a press is **level with Random** only when that interval of its difference lies within "
               f"±{margin(decided):g} (absence of evidence is never level), and **below DeCoPrune** when it lies "
               "below 0.", "",
             "| press | score | Random − press (p) | against Random | DeCoPrune − press (p) | against DeCoPrune |",
             "|---|---|---|---|---|---|"]
    for press, row in presses.iterrows():
        lines.append(f"| {press} | {row['score']:.3f} ± {row['score_ci95']:.3f} | {difference(pairs, KVPRESS_RANDOM, press)} | "
                     f"{said(decided[(press, KVPRESS_RANDOM)], 'Random')} | {difference(pairs, KVPRESS_DECOPRUNE, press)} | "
                     f"{said(decided[(press, KVPRESS_DECOPRUNE)], 'DeCoPrune')} |")
    return "\n".join(lines)


def verdict_rows(root: Path, path: Path) -> dict[tuple[str, str], dict]:
    """A board's verdict CSV (:func:`cmbench.report.verdicts.read`) by the entries each claim compares (a, b)."""
    table = verdicts.read(root / path)
    return {(str(r["a"]), str(r["b"])): r for r in table.to_dict("records")}


def family_sentence(decided: dict[tuple[str, str], dict]) -> str:
    """How a block's verdicts are decided: one family, its size and its simultaneous level (the verdict CSV's)."""
    first = next(iter(decided.values()))
    return (f"Verdicts (docs/verdicts.md) are claims decided as one family of the {int(first['family_size'])} tested "
            f"claims the block states, each read off its Bonferroni-simultaneous interval (level "
            f"{float(first['level']):.2%})")


def margin(decided: dict[tuple[str, str], dict]) -> float:
    """The equivalence margin of a block's claims (one per kind: docs/verdicts.md)."""
    return float(next(r["margin"] for r in decided.values() if r["kind"] == verdicts.EQUIVALENT))


def blocks(root: Path, findings: list[Finding], second: list[Finding] | None) -> dict[str, str]:
    """Every generated block by its marker name (``findings``/``second``: :func:`committed_page`'s)."""
    return {"findings": findings_block(findings, second), "quality": quality_block(root),
            "families": families_block(root), "kvpress": kvpress_block(root), "retrieval": retrieval_block(root)}


def with_blocks(text: str, generated: dict[str, str], where: str) -> str:
    """``text`` with each marked block replaced; ``where`` names the file in the error for a missing marker."""
    for name, body in generated.items():
        text = _replaced(text, *MARKERS[name], body, f"the {name} paragraph", where)
    return text


def with_table(text: str, marker: str, table: str, where: str) -> str:
    """``text`` with its ``<!-- results:<marker> -->`` block replaced by ``table`` (:data:`RESULT_TABLES`)."""
    return _replaced(text, *result_markers(marker), table.strip(), f"the {marker} results", where)


def result_markers(marker: str) -> tuple[str, str]:
    """The start and end markers of a results table's block."""
    return f"<!-- results:{marker} -->", f"<!-- /results:{marker} -->"


def _replaced(text: str, start: str, end: str, body: str, what: str, where: str) -> str:
    if start not in text or end not in text:
        raise ValueError(f"{where}: no {start} ... {end} block to write {what} into")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
