"""The families of KV compression a method declares, and the family a run record carries.

A method class says its own family (:attr:`cmbench.methods.base.Method.family`): one of
:data:`DECLARED`. A run's record carries the family of what ran (:func:`run_family`): the method's,
with ``+ quantization`` when a quantized storage format held its cache; FullKV (``none``) alone is the
``reference``, FullKV in a quantized format is ``quantization``; a method that declares nothing is ``other``.
Boards and figures read the family from the records, so a plug-in method keeps its family and a
relabelled run keeps it too. (Torch-free: the record schema checks the field with :data:`RECORDED`.)
"""

from __future__ import annotations

DECLARED = ("eviction", "retrieval", "merging", "low-rank", "none")
"""What a method class may declare (``none``: keeps every token, FullKV)."""
UNDECLARED = "other"
REFERENCE = "reference"
QUANTIZATION = "quantization"
RECORDED = frozenset({REFERENCE, QUANTIZATION, UNDECLARED, f"{UNDECLARED} + {QUANTIZATION}",
                      *(f for f in DECLARED if f != "none"), *(f"{f} + {QUANTIZATION}" for f in DECLARED if f != "none")})
"""Every family a record may carry."""


def run_family(declared: str, quantized: bool) -> str:
    """The family of a run of a method declaring ``declared`` ("" when it declares none) whose cache was stored
    in a quantized format (``quantized``): ``eviction``, ``eviction + quantization``, ``reference`` (FullKV),
    ``quantization`` (FullKV quantized), ``other`` (undeclared).

    Raises
    ------
    ValueError
        ``declared`` is neither empty nor one of :data:`DECLARED`.
    """
    if declared and declared not in DECLARED:
        raise ValueError(f"family {declared!r} is not one of {', '.join(DECLARED)}")
    base = declared or UNDECLARED
    if base == "none":
        return QUANTIZATION if quantized else REFERENCE
    return f"{base} + {QUANTIZATION}" if quantized else base
