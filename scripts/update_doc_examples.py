"""Run a page's printed files and shell commands and write their real output into the page.

    python scripts/update_doc_examples.py                       # docs/writing_a_method.md
    python scripts/update_doc_examples.py docs/other_page.md

The commands run in a fresh temporary folder with this checkout's ``cmbench`` (see
:mod:`cmbench.doc_examples`); tests/test_writing_a_method_doc.py checks the page against a fresh run.
For docs/writing_a_method.md, the README's time per task (between ``<!-- timings -->`` markers) is
written from the same runs, with the machine's load when they ended; tests/test_doc_timings.py checks
that it matches the page.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from cmbench.doc_examples import parse, run_session, task_seconds, timings_paragraph, with_outputs, with_timings

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "writing_a_method.md"
README = REPO / "README.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", default=str(GUIDE))
    args = parser.parse_args()
    path = Path(args.page)
    text = path.read_text()
    page = parse(text, str(path))
    with tempfile.TemporaryDirectory(prefix="cmbench-doc-") as folder:
        results = run_session(page, Path(folder) / "my_method", sys.executable, pythonpath=str(REPO))
    failed = [r for r in results if r.status != 0]
    for r in failed:
        print(f"{path}: `{r.command}` exited {r.status}:\n{r.output}", file=sys.stderr)
    if failed or len(results) != len(page.commands):
        print(f"{path}: not updated ({len(results)} of {len(page.commands)} commands ran, {len(failed)} failed)",
              file=sys.stderr)
        return 1
    path.write_text(with_outputs(text, page, results))
    print(f"{path}: outputs of {len(results)} commands written")
    if path.resolve() == GUIDE:
        paragraph = timings_paragraph(task_seconds([r.output for r in results]), os.getloadavg()[2], os.cpu_count() or 1)
        README.write_text(with_timings(README.read_text(), paragraph))
        print(f"{README}: time per task written: {paragraph}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
