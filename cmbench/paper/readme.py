"""The README's findings and quality paragraphs, generated from the committed records and CSVs.

``python scripts/update_readme_results.py`` writes them between their markers in README.md
(``<!-- findings -->`` and ``<!-- quality -->``); ``tests/test_readme_results.py`` fails when the README
says anything the committed files do not.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cmbench.paper.findings import Finding, page, summary_lines

FINDINGS = (Path("results/paper/world0"), Path("results/paper/world2"))
"""The committed records behind the findings table: the reference world, then the second world."""
TABLE = Path("results/paper_findings.md")

QUALITY = Path("results/miniworld/quality_vs_memory.csv")
REFERENCE = Path("results/miniworld/curves_reference.csv")
NAMES = {"light": "memory (light)", "temporal_flickering": "temporal flickering (camera motion here)",
         "subject_consistency_light": "subject consistency (light)",
         "background_consistency_light": "background consistency (light)"}
MARKERS = {"findings": ("<!-- findings -->", "<!-- /findings -->"), "quality": ("<!-- quality -->", "<!-- /quality -->")}


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


def blocks(root: Path, findings: list[Finding], second: list[Finding] | None) -> dict[str, str]:
    """Every generated block by its marker name (``findings``/``second``: :func:`committed_page`'s)."""
    return {"findings": findings_block(findings, second), "quality": quality_block(root)}


def with_blocks(text: str, generated: dict[str, str], where: str) -> str:
    """``text`` with each marked block replaced; ``where`` names the file in the error for a missing marker."""
    for name, body in generated.items():
        start, end = MARKERS[name]
        if start not in text or end not in text:
            raise ValueError(f"{where}: no {start} ... {end} block to write the {name} paragraph into")
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
    return text
