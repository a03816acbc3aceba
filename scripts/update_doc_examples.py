"""Run a page's printed files and shell commands and write their real output into the page.

    python scripts/update_doc_examples.py                       # docs/writing_a_method.md
    python scripts/update_doc_examples.py docs/other_page.md

The commands run in a fresh temporary folder with this checkout's ``cmbench`` (see
:mod:`cmbench.doc_examples`); tests/test_writing_a_method_doc.py checks the page against a fresh run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from cmbench.doc_examples import parse, run_session, with_outputs

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", default=str(REPO / "docs" / "writing_a_method.md"))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
