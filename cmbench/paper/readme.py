"""The README's findings, quality and families paragraphs, generated from the committed records and CSVs.

``python scripts/update_readme_results.py`` writes them between their markers in README.md
(``<!-- findings -->``, ``<!-- quality -->`` and ``<!-- families -->``); ``tests/test_readme_results.py`` fails
when the README says anything the committed files do not.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cmbench.paper.findings import Finding, page, summary_lines
from cmbench.report.families import bytes_target, family

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
MARKERS = {"findings": ("<!-- findings -->", "<!-- /findings -->"), "quality": ("<!-- quality -->", "<!-- /quality -->"),
           "families": ("<!-- families -->", "<!-- /families -->")}


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
    FullKV minus it (paired), and its continuation's PSNR against FullKV's; then, per target, the best entry and
    which entries are level with FullKV (the criterion is stated in the block)."""
    board = pd.read_csv(root / FAMILIES_BOARD)
    pairs = pd.read_csv(root / FAMILIES_PAIRS)
    versus_full = pairs[pairs["method"] == "fullkv"].set_index("versus")
    full = board.set_index("method").loc["fullkv"]
    rows = board[board["method"] != "fullkv"].copy()
    rows["target"] = [bytes_target(m) for m in rows["method"]]
    rows["order"] = rows["target"].fillna(-1.0)  # the formats alone (no target) last
    rows = rows.sort_values(["order", "score"], ascending=[False, False], kind="stable")
    seeds = int(full["seeds"])
    lines = [f"{int(full['n_tasks'])} (task, seed) pairs: the {int(full['n_tasks']) // seeds} tasks of "
             f"`miniworld_diagnostic8` x {seeds} seed{'s' if seeds > 1 else ''} (`{FAMILIES_BOARD}`, paired deltas "
             f"`{FAMILIES_PAIRS}`, commands `scripts/families_bytes.sh`). Each knob is calibrated to its bytes target "
             "on 2 calibration tasks; *device bytes* is what the entry stored on the test tasks over FullKV's. "
             f"FullKV scores {full['score']:.3f} ± {full['score_ci95']:.3f}. An entry is **level with FullKV** when "
             "FullKV minus it has a 95% CI (clustered by context) that includes 0, below or above it when the CI "
             "lies wholly on one side.", "",
             "| target | entry | family | device bytes | score | FullKV − entry (p) | PSNR vs FullKV |",
             "|---|---|---|---|---|---|---|"]
    verdicts: dict[tuple[float, str], list[str]] = {}  # (order, level / below / above) -> entries
    for row in rows.itertuples():
        pair = versus_full.loc[row.method] if row.method in versus_full.index else None
        delta = "" if pair is None else f"{pair['delta']:+.3f} ± {pair['delta_ci95']:.3f} ({pair['p_value']:.2g})"
        target = "format alone" if pd.isna(row.target) else f"{row.target:g}"
        lines.append(f"| {target} | {row.method} | {family(row.method)} | {row.kv_bytes_ratio:.3f} | "
                     f"{row.score:.3f} ± {row.score_ci95:.3f} | {delta} | {row.psnr_vs_fullkv:.1f} dB |")
        if pair is not None:
            side = ("level" if abs(pair["delta"]) <= pair["delta_ci95"] else "below" if pair["delta"] > 0 else "above")
            verdicts.setdefault((row.order, side), []).append(row.method)
    lines.append("")
    for target, group in rows.groupby("order", sort=False):
        best = group.iloc[0]
        said = [f"{name}: {', '.join(verdicts.get((target, side), [])) or 'none'}"
                for side, name in (("level", "level with FullKV"), ("below", "below it"))]
        if verdicts.get((target, "above")):
            said.append(f"above it: {', '.join(verdicts[(target, 'above')])}")
        where = "The formats alone" if target < 0 else f"At {target:g} of FullKV's bytes"
        lines.append(f"- {where}: best {best['method']} ({family(best['method'])}) {best['score']:.3f}; "
                     + "; ".join(said) + ".")
    return "\n".join(lines)


def blocks(root: Path, findings: list[Finding], second: list[Finding] | None) -> dict[str, str]:
    """Every generated block by its marker name (``findings``/``second``: :func:`committed_page`'s)."""
    return {"findings": findings_block(findings, second), "quality": quality_block(root),
            "families": families_block(root)}


def with_blocks(text: str, generated: dict[str, str], where: str) -> str:
    """``text`` with each marked block replaced; ``where`` names the file in the error for a missing marker."""
    for name, body in generated.items():
        start, end = MARKERS[name]
        if start not in text or end not in text:
            raise ValueError(f"{where}: no {start} ... {end} block to write the {name} paragraph into")
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
    return text
