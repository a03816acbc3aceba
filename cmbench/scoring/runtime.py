"""Where deep backends run (device, precision, batch size) and how they load their models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cmbench.scoring.errors import ModelLoadError, ScorerConfigError


@dataclass(frozen=True)
class Runtime:
    """Execution settings shared by the deep backends.

    Attributes
    ----------
    device : torch.device
    dtype : torch.dtype
        ``float16`` only when half precision is asked for and the device is CUDA, else ``float32``.
    batch_size : int
        Frames (or crops) per forward pass.
    """

    device: torch.device
    dtype: torch.dtype
    batch_size: int

    @property
    def precision(self) -> str:
        """``"fp16"`` or ``"fp32"`` (part of the scorer's config hash: it changes the numbers)."""
        return "fp16" if self.dtype == torch.float16 else "fp32"


def resolve_runtime(device: str = "auto", half: bool = False, batch_size: int = 8) -> Runtime:
    """Build a :class:`Runtime` from config values.

    Parameters
    ----------
    device : str
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    half : bool
        Half precision on CUDA; ignored on CPU.
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
    if int(batch_size) < 1:
        raise ScorerConfigError(f"scorer.batch_size must be >= 1, got {batch_size}")
    dtype = torch.float16 if half and dev.type == "cuda" else torch.float32
    return Runtime(device=dev, dtype=dtype, batch_size=int(batch_size))


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
