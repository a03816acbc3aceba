"""Where deep backends run (device, precision, batch size), how they load their models, and what
identifies the models they loaded (for the feature cache)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cmbench.hashing import file_hash, json_digest
from cmbench.scoring.errors import ModelLoadError, ScorerConfigError

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Runtime:
    """Execution settings shared by the deep backends.

    Attributes
    ----------
    device : torch.device
    precision : {"fp32", "fp16", "bf16"}
        The effective precision: models keep float32 weights and run their forward passes under
        ``torch.autocast`` to this dtype (SAM 2's upstream predictor runs under bf16 autocast).
    batch_size : int
        Frames (or crops) per forward pass.
    """

    device: torch.device
    precision: str
    batch_size: int

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ScorerConfigError(f"scorer.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the forward passes run in (a no-op for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=PRECISIONS[self.precision])


def resolve_runtime(device: str = "auto", precision: str = "fp32", batch_size: int = 8) -> Runtime:
    """Build a :class:`Runtime` from config values.

    Parameters
    ----------
    device : str
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    precision : {"fp32", "fp16", "bf16"}
        Autocast precision on CUDA; a CPU always runs fp32 (the effective precision is what the
        scorer hashes and records).
    batch_size : int
        Positive.
    """
    if device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ScorerConfigError(f"scorer.device={device!r} is not a torch device ({err})") from err
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ScorerConfigError(f"scorer.device={device!r} but CUDA is not available; use device=auto or cpu")
    if precision not in PRECISIONS:
        raise ScorerConfigError(f"scorer.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if int(batch_size) < 1:
        raise ScorerConfigError(f"scorer.batch_size must be >= 1, got {batch_size}")
    return Runtime(device=dev, precision=precision if dev.type == "cuda" else "fp32", batch_size=int(batch_size))


def load_pretrained(loader: Any, name_or_path: str, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained(name_or_path)`` with an actionable error.

    Parameters
    ----------
    loader : class with ``from_pretrained`` (a transformers model or processor class)
    name_or_path : str
        Hub id (e.g. ``google/owlvit-base-patch32``) or a local ``save_pretrained`` folder.
    what : str
        The stage, for the message (``"detector"``, ...).
    """
    try:
        return loader.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"cannot load the {what} model {name_or_path!r} with {loader.__name__}: {err}\n"
            "Give a local folder in save_pretrained layout or a hub id this machine can reach "
            "(with HF_HUB_OFFLINE=1 only local folders and the local HF cache are used)."
        ) from err


def folder_digest(folder: str | Path) -> str:
    """Digest of every file's content in a model folder (weights, configs, processor and tokenizer
    files; names starting with ``.`` are skipped), so replacing the weights in place changes it.

    Returns
    -------
    str
        32 hex digits.
    """
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return json_digest({str(p.relative_to(root)): file_hash(p) for p in files})


def model_identity(name_or_path: str, model: Any) -> dict[str, str]:
    """What decides a loaded transformers model's numbers, for the feature-cache key.

    Parameters
    ----------
    name_or_path : str
        What was passed to ``from_pretrained``.
    model : a transformers model loaded from it

    Returns
    -------
    dict
        ``files``: :func:`folder_digest` of a local folder (weights, config, processor files), or
        ``commit``: the hub commit the model was resolved to; and ``transformers``: its version
        (the processors' and models' code).
    """
    import transformers

    if Path(name_or_path).is_dir():
        source = {"files": folder_digest(name_or_path)}
    else:
        commit = getattr(model.config, "_commit_hash", None)
        if not commit:
            raise ModelLoadError(f"cannot tell which revision of {name_or_path!r} was loaded (no hub commit hash)")
        source = {"commit": str(commit)}
    return {**source, "transformers": transformers.__version__}
