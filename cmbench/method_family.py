"""The families of KV compression a method declares, and the family a run record carries.

A method class says its own family (:attr:`cmbench.methods.base.Method.family`): one of
:data:`DECLARED`. A run's record carries the family of what ran (:func:`run_family`): the method's,
with the storage format's family added when one held its cache (``+ quantization`` for KIVI, Quant VideoGen
and chunk-mean codes, ``+ low-rank`` for low-rank keys: :data:`STORAGE_FAMILY`); FullKV (``none``) alone is
the ``reference``, FullKV in a storage format is that format's family; a method that declares nothing is ``other``.
Boards and figures read the family from the records, so a plug-in method keeps its family and a
relabelled run keeps it too. (Torch-free: the record schema checks the field with :data:`RECORDED`.)
"""

from __future__ import annotations

DECLARED = ("eviction", "retrieval", "merging", "low-rank", "none")
"""What a method class may declare (``none``: keeps every token, FullKV)."""
UNDECLARED = "other"
REFERENCE = "reference"
QUANTIZATION = "quantization"
LOW_RANK = "low-rank"
STORAGE_FAMILY = {"fp": "", "kivi": QUANTIZATION, "qvg": QUANTIZATION, "chunkmean": QUANTIZATION, "lowrank": LOW_RANK}
"""The family a storage format (:data:`cmbench.cache.quantized.FORMATS`) adds to a run's (``fp``: none)."""
RECORDED = frozenset({REFERENCE, UNDECLARED, *(f for f in DECLARED if f != "none"),
                      *(f"{base} + {added}" for base in (UNDECLARED, *DECLARED) if base != "none"
                        for added in (QUANTIZATION, LOW_RANK) if added != base),
                      QUANTIZATION, LOW_RANK})
"""Every family a record may carry."""


def run_family(declared: str, storage: str = "fp") -> str:
    """The family of a run of a method declaring ``declared`` ("" when it declares none) whose cache was stored
    in the format named ``storage``: ``eviction``, ``eviction + quantization``, ``eviction + low-rank``,
    ``reference`` (FullKV), ``quantization`` or ``low-rank`` (FullKV in such a format), ``other`` (undeclared).
    A low-rank method in a low-rank format is ``low-rank``.

    Raises
    ------
    ValueError
        ``declared`` is neither empty nor one of :data:`DECLARED`, or ``storage`` names no storage format.
    """
    if declared and declared not in DECLARED:
        raise ValueError(f"family {declared!r} is not one of {', '.join(DECLARED)}")
    if storage not in STORAGE_FAMILY:
        raise ValueError(f"storage format {storage!r} is not one of {', '.join(STORAGE_FAMILY)}")
    base, added = declared or UNDECLARED, STORAGE_FAMILY[storage]
    if base == "none":
        return added or REFERENCE
    return f"{base} + {added}" if added and added != base else base
