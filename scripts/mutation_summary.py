"""The command line of the mutation-testing bookkeeping (tests/devtools/mutation_summary.py, which says its
commands); scripts/mutation_test.sh calls it. Development only: it is not part of the installed package."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from devtools.mutation_summary import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
