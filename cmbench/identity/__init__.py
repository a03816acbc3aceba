"""What names a run and what computed its records: code.py (the code identity every record carries),
labels.py (automatic run labels), paths.py (names made safe as path components)."""
