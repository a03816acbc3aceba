"""The paper's claims as commands: diagnose.py (its motivating observation, ``python -m cmbench diagnose``) and
findings.py (its findings, one row each, rebuilt from run records by scripts/paper_findings.py)."""
