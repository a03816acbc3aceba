"""The backbone contract: geometry and the :class:`Backbone` protocol (docs/architecture.md).

A backbone turns pixels into latents and back, says what a task conditions on, and predicts the clean
latents ``x0`` of one chunk given a noisy chunk and the KV cache. It never stores keys or values: for
every layer it hands the chunk's rotated queries and keys to ``cache.attend(layer, q, k, v)``.

Layouts: pixel video ``uint8 [F, H, W, 3]``; latents ``float [B, C, F, h, w]``; tokens of a chunk
``[B, L, ...]`` with ``L = f * (h / ph) * (w / pw)``, frame-major, then row, then column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable, Protocol, runtime_checkable

import torch

from cmbench.cache.rope import RopeSpec
from cmbench.errors import ConfigError

if TYPE_CHECKING:  # the cache imports nothing from backbones; this import is for type hints only
    from cmbench.cache.kv_cache import KVCache


@dataclass(frozen=True)
class Geometry:
    """Shape facts about a backbone that the cache, methods and generation loop rely on.

    Parameters
    ----------
    num_layers, num_heads, head_dim : int
        Self-attention layers, heads per layer and channels per head.
    latent_channels : int
        ``C`` of the latents ``[B, C, F, h, w]``.
    latent_height, latent_width : int
        ``h`` and ``w`` of one latent frame.
    rope : RopeSpec
        Rotary layout of the keys (temporal axis first); ``rope.head_dim == head_dim``.
    patch : tuple of int
        DiT patch ``(pt, ph, pw)``; ``pt`` must be 1 (one token never spans two latent frames).
    chunk_frames : int
        Latent frames generated per AR chunk.
    """

    num_layers: int
    num_heads: int
    head_dim: int
    latent_channels: int
    latent_height: int
    latent_width: int
    rope: RopeSpec
    patch: tuple[int, int, int] = (1, 2, 2)
    chunk_frames: int = 4

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "head_dim", "latent_channels", "latent_height", "latent_width",
                     "chunk_frames"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"geometry.{name} must be positive, got {getattr(self, name)}")
        object.__setattr__(self, "patch", tuple(int(p) for p in self.patch))
        pt, ph, pw = self.patch
        if pt != 1:
            raise ConfigError(f"geometry.patch must have temporal size 1, got {self.patch}")
        if self.latent_height % ph or self.latent_width % pw:
            raise ConfigError(
                f"latent frame {self.latent_height}x{self.latent_width} is not divisible by patch {ph}x{pw}"
            )
        if self.rope.head_dim != self.head_dim:
            raise ConfigError(f"rope covers {self.rope.head_dim} channels but head_dim is {self.head_dim}")

    @property
    def token_rows(self) -> int:
        """Token grid rows per latent frame (``h / ph``)."""
        return self.latent_height // self.patch[1]

    @property
    def token_cols(self) -> int:
        """Token grid columns per latent frame (``w / pw``)."""
        return self.latent_width // self.patch[2]

    @property
    def tokens_per_frame(self) -> int:
        """Tokens of one latent frame."""
        return self.token_rows * self.token_cols

    @property
    def tokens_per_chunk(self) -> int:
        """Tokens of one full chunk (``chunk_frames * tokens_per_frame``)."""
        return self.chunk_frames * self.tokens_per_frame

    @property
    def values_per_token(self) -> int:
        """Latent values one token covers (``C * ph * pw``)."""
        return self.latent_channels * self.patch[1] * self.patch[2]

    def tokenize(self, latents: torch.Tensor) -> torch.Tensor:
        """Group latent values by DiT token.

        Parameters
        ----------
        latents : Tensor, shape ``[B, C, f, h, w]``

        Returns
        -------
        Tensor, shape ``[B, f * (h / ph) * (w / pw), C * ph * pw]``
            Tokens frame-major, then row, then column; values channel-major within a token.
        """
        if latents.dim() != 5 or latents.shape[1] != self.latent_channels or tuple(latents.shape[3:]) != (
            self.latent_height,
            self.latent_width,
        ):
            raise ValueError(
                f"latents must be [B, {self.latent_channels}, f, {self.latent_height}, {self.latent_width}], "
                f"got {tuple(latents.shape)}"
            )
        b, c, f, _, _ = latents.shape
        _, ph, pw = self.patch
        x = latents.reshape(b, c, f, self.token_rows, ph, self.token_cols, pw)
        return x.permute(0, 2, 3, 5, 1, 4, 6).reshape(b, f * self.tokens_per_frame, c * ph * pw)


@runtime_checkable
class Backbone(Protocol):
    """What :mod:`cmbench.generation` needs from a video model (see docs/architecture.md)."""

    geometry: Geometry

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Pixels ``uint8 [F, H, W, 3]`` -> latents ``float [1, C, F', h, w]``."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``float [1, C, F', h, w]`` -> pixels ``uint8 [F, H, W, 3]``.

        A backbone whose VAE is causal in time may also implement ``decode_continuation(latents,
        context)``: the frames of ``latents`` decoded after the context latents they follow (see
        :func:`decode_continuation`).
        """
        ...

    def condition(self, task: Any) -> Any:
        """What a task conditions on (prompts, camera); passed unchanged to :meth:`denoise`.

        It covers the whole timeline (context and continuation): ``denoise`` indexes it by absolute
        latent frame through ``frame_start``.

        A backbone may also implement ``prefill_key(cond, context_frames)``: a hashable value equal for
        two conditions of one context exactly when a prefill of its first ``context_frames`` latent
        frames reads the same conditioning under both (see :func:`prefill_key`), and
        ``camera_poses(cond)``: the camera-to-world pose of every latent frame, ``[F, 4, 4]``, or
        ``None`` when the task has none (what pose-retrieval methods read).
        """
        ...

    def denoise(self, x_t: torch.Tensor, t: float, cache: "KVCache", frame_start: int, cond: Any) -> torch.Tensor:
        """Predict the clean chunk.

        Parameters
        ----------
        x_t : Tensor, shape ``[B, C, f, h, w]``
            The noisy chunk, ``x_t = (1 - t) * x0 + t * eps``.
        t : float
            Noise level in ``[0, 1]`` (``timestep / 1000``); ``t = 0`` is the clean K/V write.
        cache : KVCache
            Every layer calls ``cache.attend(layer, q, k, v)`` with the chunk's rotated ``[B, L, H, D]``.
        frame_start : int
            Absolute latent frame index of the chunk's first frame (its temporal RoPE position).
        cond : Any
            From :meth:`condition`.

        Returns
        -------
        Tensor, shape ``[B, C, f, h, w]``: ``x0_hat``.
        """
        ...


def decode_continuation(backbone: Backbone, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """The pixels of a continuation as the benchmark scores them.

    A backbone with a temporally causal VAE (the Wan family) decodes the continuation after its context
    (``backbone.decode_continuation``), which gives the frames a decode of the whole timeline gives
    (LingBot: 4 per latent frame, 64 for 16). A backbone without one (the tiny model: one frame per
    latent frame, no temporal state) decodes the continuation alone.

    Parameters
    ----------
    backbone : Backbone
    latents : Tensor ``[1, C, F', h, w]``
        The continuation.
    context : Tensor ``[1, C, q0, h, w]``
        The context latents before it.

    Returns
    -------
    Tensor ``uint8 [F, H, W, 3]``
    """
    after_context = getattr(backbone, "decode_continuation", None)
    return after_context(latents, context) if after_context is not None else backbone.decode(latents)


def prefill_key(backbone: Backbone, cond: Any, context_frames: int, task_id: str) -> Hashable:
    """What a context's prefill depends on in ``cond``: tasks of one context with equal keys share one
    prefill, tasks with different keys get their own (the authors replay the context under each
    request's own prompt).

    A backbone that says what its prefill reads (``backbone.prefill_key``: the tiny model, the camera
    offsets of the context frames; the Wan family, the prompts and camera of the context frames) lets
    tasks share; any other backbone gets one prefill per task (``task_id``), which is always correct.

    Parameters
    ----------
    backbone : Backbone
    cond : Any
        ``backbone.condition(task)``.
    context_frames : int
        ``q0``, latent frames of the context.
    task_id : str
        The task ``cond`` belongs to (the key of a backbone that does not say).
    """
    own = getattr(backbone, "prefill_key", None)
    return ("backbone", own(cond, context_frames)) if own is not None else ("task", task_id)
