"""CMBench's own development harness, kept out of the installed package: the hostile pass (hostile.py; the
probes in hostile_probes.py and one hostile_probes_<class>.py per class of attack, gathered by
hostile_pass.py; command line scripts/hostile_probes.py) and the mutation-testing bookkeeping
(mutation_summary.py; command line scripts/mutation_summary.py, driven by scripts/mutation_test.sh).
Tests import it as ``devtools`` (pytest puts tests/ on the path); the scripts add tests/ themselves."""
