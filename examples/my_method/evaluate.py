"""Run the method from Python: the same run directory, records and cache as the command line."""

import cmbench

result = cmbench.evaluate(method="key_norm", limit=2, overrides=["method.target_pr=0.8"])
print(result.run_dir)
print(result.records[["task_id", "score", "pr"]].to_string(index=False))
