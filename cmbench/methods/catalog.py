"""The methods table of the README and docs/methods.md, generated from the registered classes.

Each row comes from the class alone (``name``, ``description``, ``paper``, ``paper_title``), so the
documentation cannot drift from the code: ``scripts/update_method_tables.py`` writes the table between
the ``<!-- methods -->`` markers and a test checks both files carry it.
"""

from __future__ import annotations

from cmbench.methods.registry import describe_methods

# order of the table: the reference, the baselines, then DeCoPrune and its controls
ORDER = ("fullkv", "streaming", "decoprune", "decoprune_reverse", "decoprune_hs", "random", "tempdiff", "forcingkv",
         "dummyforcing", "worldkv", "worldkv_fixed_window", "key_retrieval")
MARKERS = ("<!-- methods -->", "<!-- /methods -->")


def paper_cell(paper: str, title: str) -> str:
    """``[title](url)``, the title alone, the url alone, or an em dash."""
    if paper and title:
        return f"[{title}]({paper})"
    return title or paper or "—"


def markdown_table() -> str:
    """``| Method | What it keeps | Paper |`` with one row per registered method (built-ins first)."""
    docs = describe_methods()
    names = [n for n in ORDER if n in docs] + sorted(set(docs) - set(ORDER))
    rows = ["| Method | What it keeps | Paper |", "|---|---|---|"]
    for name in names:
        d = docs[name]
        rows.append(f"| `{name}` | {d['description']} | {paper_cell(d['paper'], d['paper_title'])} |")
    return "\n".join(rows)


def with_table(text: str, where: str) -> str:
    """``text`` with the section between :data:`MARKERS` replaced by :func:`markdown_table`.

    Raises
    ------
    ValueError
        ``text`` (named ``where`` in the message) has no such section.
    """
    start, end = MARKERS
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{where} has no {start} ... {end} section")
    return f"{text[:i]}{start}\n{markdown_table()}\n{text[j:]}"
