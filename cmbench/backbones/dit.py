"""The one causal Wan-family diffusion transformer (DiT) of CMBench.

Every backbone (the tiny MiniWorld model and the real Wan / LingBot checkpoints) runs this module.
Its structure and parameter names follow the original Wan release (``wan/modules/model.py``) and
LingBot World's camera path, so a real checkpoint maps onto it key by key:

- ``patch_embedding``: ``Conv3d(in_channels, dim, patch, stride=patch)``;
- ``time_embedding`` (``Linear, SiLU, Linear``) on a sinusoidal embedding of ``1000 * t``,
  ``time_projection`` (``SiLU, Linear(dim, 6 * dim)``): Wan's adaLN modulation;
- ``text_embedding`` (``Linear, GELU(tanh), Linear``), present when ``text_dim`` is set;
- ``patch_embedding_wancamctrl``, ``c2ws_hidden_states_layer1/2``: LingBot's camera embedding,
  present when ``camera_dim`` is set;
- ``blocks.<i>``: ``norm1`` (LayerNorm, no affine), ``self_attn.{q,k,v,o,norm_q,norm_k}``,
  ``cam_injector_layer1/2``, ``cam_scale_layer``, ``cam_shift_layer`` (camera), ``norm3`` and
  ``cross_attn.{q,k,v,o,norm_q,norm_k}`` (text), ``norm2``, ``ffn.{0,2}``, ``modulation [1, 6, dim]``;
- ``head.{norm, head, modulation [1, 2, dim]}``.

A block computes (``e`` = the block's six modulation vectors, ``c`` = the camera embedding)::

    x = x + gate1 * self_attn(norm1(x) * (1 + scale1) + shift1)       # 3D RoPE, q/k RMS norm
    x = (1 + cam_scale(h)) * x + cam_shift(h),  h = c + cam_injector2(silu(cam_injector1(c)))
    x = x + cross_attn(norm3(x), text)
    x = x + gate2 * ffn(norm2(x) * (1 + scale2) + shift2)

Precision: the linear layers run in their weights' dtype (the *compute* dtype, bf16 on GPUs); the
residual stream ``x`` keeps the dtype it enters the blocks with. :attr:`CausalWanDiT.residual_dtype`
sets it: ``None`` keeps the patch embedding's (compute) dtype, ``torch.float32`` carries the residual
stream in float32 (every gated add, the camera modulation and the cross-attention add in float32, as
LingBot's runtime does inside its float32 autocast regions); the head then runs in its own weights'
dtype (float32 when :func:`~cmbench.backbones.wan.precision.cast_for_inference` keeps it as an island).

Self-attention never stores keys or values: it hands the chunk's rotated queries and keys to an
:class:`Attention` backend. At inference that is the KV cache (``KVCache.attend``); for training it
is :class:`BlockCausalAttention` over one teacher-forced sequence, so the two paths run the same
arithmetic.

Layouts: latents ``[B, C, F, H, W]``; tokens ``[B, L, dim]`` frame-major, then row, then column;
queries / keys / values ``[B, L, heads, head_dim]``; positions ``[L, 3]`` or ``[B, L, 3]`` as
(t, h, w) in token units (see :mod:`cmbench.cache.rope`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from cmbench.cache.rope import RopeSpec, apply_rotary


@dataclass(frozen=True)
class DiTConfig:
    """Shape of a causal Wan-family DiT.

    Parameters
    ----------
    in_channels, out_channels : int
        Latent channels in and out (LingBot I2V: 36 in = noise 16 + mask 4 + first frame 16; 16 out).
    dim : int
        Model width; ``dim = num_heads * head_dim``.
    ffn_dim : int
        Hidden width of the feed-forward network.
    num_heads, num_layers : int
    patch_size : tuple of int
        (t, h, w) patch of the patch embedding; Wan uses (1, 2, 2).
    freq_dim : int
        Size of the sinusoidal timestep embedding.
    text_dim : int or None
        Width of the text encoder's output; ``None`` builds no text cross-attention.
    camera_dim : int or None
        Camera channels per latent pixel (LingBot: 6 Plucker values x 8 x 8 pixels = 384);
        ``None`` builds no camera path. A token's camera input is its patch's ``camera_dim *
        prod(patch_size)`` values.
    cross_attn_norm : bool
        Affine LayerNorm ``norm3`` before cross-attention (Wan's ``cross_attn_norm``).
    eps : float
        Epsilon of every norm.
    """

    in_channels: int
    out_channels: int
    dim: int
    ffn_dim: int
    num_heads: int
    num_layers: int
    patch_size: tuple[int, int, int] = (1, 2, 2)
    freq_dim: int = 256
    text_dim: int | None = None
    camera_dim: int | None = None
    cross_attn_norm: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of num_heads {self.num_heads}")
        if (self.dim // self.num_heads) % 2:
            raise ValueError("head_dim must be even for rotary embeddings")
        if len(self.patch_size) != 3:
            raise ValueError(f"patch_size must have 3 entries (t, h, w), got {self.patch_size}")
        if self.freq_dim % 2:
            raise ValueError("freq_dim must be even")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def to_dict(self) -> dict:
        """JSON-ready dict; :meth:`from_dict` rebuilds the same config."""
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DiTConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown DiT config keys {unknown}; known: {sorted(known)}")
        return cls(**d)


class Attention(Protocol):
    """Where self-attention reads its keys and values (the KV cache, or a masked full sequence)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention output ``[B, L, H, D]`` for rotated ``q``, ``k`` and ``v`` of shape ``[B, L, H, D]``."""
        ...


class BlockCausalAttention:
    """Diffusion-forcing attention over one teacher-forced sequence (the training path).

    The sequence is a list of segments, each one chunk of ``tokens_per_chunk`` tokens: a clean
    chunk ``(i, False)`` or a noisy copy ``(i, True)`` of chunk ``i``. A clean chunk ``i`` reads
    every clean chunk ``<= i``; a noisy copy of chunk ``i`` reads the clean chunks ``< i`` and
    itself (and no other noisy copy). That is exactly what chunk-by-chunk generation sees: the
    cache holds the clean K/V of earlier chunks (written by the ``t = 0`` pass) and the current
    chunk attends to itself in full, so one forward here equals a whole AR rollout through the
    cache with teacher forcing.

    Each segment's queries attend to the gathered keys it may read (no mask, no wasted blocks).

    Parameters
    ----------
    segments : list of (chunk index, noisy)
        The layout, shared by every sample of the batch.
    tokens_per_chunk : int
    """

    def __init__(self, segments: list[tuple[int, bool]], tokens_per_chunk: int) -> None:
        self.segments = [(int(c), bool(nz)) for c, nz in segments]
        self.tokens_per_chunk = tokens_per_chunk
        self._reads = [self._readable(s) for s in range(len(self.segments))]

    def _readable(self, s: int) -> list[int]:
        """Indices of the segments segment ``s`` may read, in sequence order."""
        chunk, noisy = self.segments[s]
        return [
            r
            for r, (c, nz) in enumerate(self.segments)
            if r == s or (not nz and (c < chunk or (c == chunk and not noisy)))
        ]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Block-causal softmax attention; ``q, k, v`` and the result are ``[B, L, H, D]``."""
        n = self.tokens_per_chunk
        if q.shape[1] != n * len(self.segments):
            raise ValueError(f"sequence has {q.shape[1]} tokens, segments describe {n * len(self.segments)}")
        # split once into per-segment pieces: cheap to gather and cheap to back-propagate through
        qs, ks, vs = (x.transpose(1, 2).split(n, dim=2) for x in (q, k, v))
        outs = [
            F.scaled_dot_product_attention(
                qs[s], torch.cat([ks[r] for r in reads], dim=2), torch.cat([vs[r] for r in reads], dim=2)
            )
            for s, reads in enumerate(self._reads)
        ]
        return torch.cat(outs, dim=2).transpose(1, 2)


def sinusoidal_embedding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """Wan's sinusoidal timestep embedding, ``[cos, sin]`` halves.

    Parameters
    ----------
    timesteps : Tensor, shape ``[N]``
        Timesteps on Wan's 0..1000 scale.
    dim : int
        Embedding size (even).

    Returns
    -------
    Tensor, shape ``[N, dim]``, float32
    """
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=timesteps.device) / half)
    angles = timesteps.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


def grid_positions(frame_start: int, frames: int, rows: int, cols: int) -> torch.Tensor:
    """Wan's RoPE positions of a token grid: (frame index, row, column), frame-major.

    Returns
    -------
    Tensor, shape ``[frames * rows * cols, 3]``, float32
    """
    t, h, w = torch.meshgrid(
        torch.arange(frame_start, frame_start + frames), torch.arange(rows), torch.arange(cols), indexing="ij"
    )
    return torch.stack([t, h, w], dim=-1).reshape(-1, 3).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [B, L, H, D]`` with ``cos, sin`` of shape ``[L, D/2]`` or ``[B, L, D/2]``."""
    if cos.dim() == 2:
        return apply_rotary(x, cos, sin)
    b, l, h, d = x.shape
    return apply_rotary(x.reshape(1, b * l, h, d), cos.reshape(b * l, -1), sin.reshape(b * l, -1)).reshape(b, l, h, d)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift`` with per-frame modulation.

    ``x`` is ``[B, L, dim]`` with ``L = frames * tokens_per_frame``; ``shift, scale`` are
    ``[B, frames, dim]``.
    """
    b, l, d = x.shape
    frames = shift.shape[1]
    xf = x.reshape(b, frames, l // frames, d)
    return (xf * (1 + scale[:, :, None]) + shift[:, :, None]).reshape(b, l, d)


def _gate(y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``y * gate`` with ``y [B, L, dim]`` and a per-frame ``gate [B, frames, dim]``."""
    b, l, d = y.shape
    frames = gate.shape[1]
    return (y.reshape(b, frames, l // frames, d) * gate[:, :, None]).reshape(b, l, d)


class LayerNorm32(nn.LayerNorm):
    """LayerNorm computed in float32 and returned in the input dtype (Wan's ``WanLayerNorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).type_as(x)


class AttentionProjections(nn.Module):
    """Wan's attention parameters: q/k/v/o projections and q/k RMS norms across all heads."""

    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = nn.RMSNorm(dim, eps=eps)
        self.norm_k = nn.RMSNorm(dim, eps=eps)

    def project(
        self, x: torch.Tensor, source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries from ``x [B, L, dim]``, keys and values from ``source [B, S, dim]``.

        Returns
        -------
        q : Tensor ``[B, L, H, D]``; k, v : Tensor ``[B, S, H, D]``
        """
        q = self.norm_q(self.q(x)).unflatten(-1, (self.num_heads, -1))
        k = self.norm_k(self.k(source)).unflatten(-1, (self.num_heads, -1))
        v = self.v(source).unflatten(-1, (self.num_heads, -1))
        return q, k, v


class SelfAttention(AttentionProjections):
    """Wan self-attention with 3D RoPE; keys and values go to the :class:`Attention` backend."""

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Attention, layer: int
    ) -> torch.Tensor:
        """
        Parameters
        ----------
        x : Tensor ``[B, L, dim]``
        cos, sin : Tensor ``[L, head_dim / 2]`` or ``[B, L, head_dim / 2]``
        attention : Attention
        layer : int
            This block's index, passed to ``attention.attend``.

        Returns
        -------
        Tensor ``[B, L, dim]``
        """
        q, k, v = self.project(x, x)
        out = attention.attend(layer, _rotate(q, cos, sin), _rotate(k, cos, sin), v)
        return self.o(out.flatten(2))


class CrossAttention(AttentionProjections):
    """Wan text cross-attention (no RoPE, no mask)."""

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``x [B, L, dim]`` attends to ``context [B, S, dim]``; returns ``[B, L, dim]``."""
        q, k, v = (a.transpose(1, 2) for a in self.project(x, context))
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class DiTBlock(nn.Module):
    """One Wan block with LingBot's camera injection after self-attention."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        dim = cfg.dim
        self.norm1 = LayerNorm32(dim, eps=cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(dim, cfg.num_heads, cfg.eps)
        if cfg.camera_dim is not None:
            self.cam_injector_layer1 = nn.Linear(dim, dim)
            self.cam_injector_layer2 = nn.Linear(dim, dim)
            self.cam_scale_layer = nn.Linear(dim, dim)
            self.cam_shift_layer = nn.Linear(dim, dim)
        if cfg.text_dim is not None:
            self.norm3 = LayerNorm32(dim, eps=cfg.eps) if cfg.cross_attn_norm else nn.Identity()
            self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.eps)
        self.norm2 = LayerNorm32(dim, eps=cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        e: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: Attention,
        layer: int,
        text: torch.Tensor | None,
        camera: torch.Tensor | None,
    ) -> torch.Tensor:
        """
        Parameters
        ----------
        x : Tensor ``[B, L, dim]``
            The residual stream (its dtype is kept: float32 or the compute dtype).
        e : Tensor ``[B, frames, 6, dim]``
            Per-frame timestep projection (``time_projection`` output).
        cos, sin : Tensor ``[L, head_dim / 2]`` or ``[B, L, head_dim / 2]``
        attention : Attention
        layer : int
        text : Tensor ``[B, S, dim]`` or None
            Embedded text context.
        camera : Tensor ``[B, L, dim]`` or None
            Embedded camera of each token.

        Returns
        -------
        Tensor ``[B, L, dim]``
        """
        compute = self.ffn.get_parameter("0.weight").dtype  # the linear layers' dtype; x keeps the residual dtype
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation[None] + e.float()).unbind(2)
        y = self.self_attn(_modulate(self.norm1(x).float(), shift1, scale1).to(compute), cos, sin, attention, layer)
        x = x + _gate(y.float(), gate1).to(x.dtype)
        if camera is not None:
            h = camera + self.cam_injector_layer2(F.silu(self.cam_injector_layer1(camera)))
            x = ((1.0 + self.cam_scale_layer(h)) * x + self.cam_shift_layer(h)).to(x.dtype)
        if text is not None:
            x = x + self.cross_attn(self.norm3(x).to(compute), text).to(x.dtype)
        y = self.ffn(_modulate(self.norm2(x).float(), shift2, scale2).to(compute))
        return x + _gate(y.float(), gate2).to(x.dtype)


class Head(nn.Module):
    """Output head: modulated LayerNorm and a projection to patch values (Wan's ``Head``)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.norm = LayerNorm32(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, math.prod(cfg.patch_size) * cfg.out_channels)
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """``x [B, L, dim]``, per-frame time embedding ``e [B, frames, dim]`` -> ``[B, L, prod(patch) * C_out]``."""
        shift, scale = (self.modulation[None] + e.float()[:, :, None]).unbind(2)
        return self.head(_modulate(self.norm(x).float(), shift, scale).to(self.head.weight.dtype))


class CausalWanDiT(nn.Module):
    """Causal Wan-family DiT: predicts ``x0`` for a chunk (or a teacher-forced sequence).

    Parameters
    ----------
    cfg : DiTConfig
    rope : RopeSpec
        Rotary layout of one head; ``rope.head_dim`` must equal ``cfg.head_dim``.
    """

    def __init__(self, cfg: DiTConfig, rope: RopeSpec) -> None:
        super().__init__()
        if rope.head_dim != cfg.head_dim:
            raise ValueError(f"rope head_dim {rope.head_dim} != model head_dim {cfg.head_dim}")
        self.cfg = cfg
        self.rope = rope
        self.residual_dtype: torch.dtype | None = None  # None: the compute dtype (see the module docstring)
        self.sequence: Any = None  # a cmbench.parallel.SequenceGroup: run split over its ranks (split_backbone)
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_channels, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        if cfg.text_dim is not None:
            self.text_embedding = nn.Sequential(
                nn.Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
            )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        if cfg.camera_dim is not None:
            self.patch_embedding_wancamctrl = nn.Linear(cfg.camera_dim * math.prod(cfg.patch_size), dim)
            self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
            self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList([DiTBlock(cfg) for _ in range(cfg.num_layers)])
        self.head = Head(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Training initialisation: Xavier linears, zero output head, identity camera injection.

        A checkpoint load overwrites all of it. Zero ``head.head`` (as Wan) and zero camera
        scale/shift layers make a fresh model start from a well-conditioned identity path.
        """
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.xavier_uniform_(self.patch_embedding.weight.flatten(1))
        for seq in (self.time_embedding, getattr(self, "text_embedding", None)):
            for m in seq.modules() if seq is not None else ():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(self.head.head.weight)
        if self.cfg.camera_dim is not None:
            for block in self.blocks:
                for name in ("cam_scale_layer", "cam_shift_layer"):
                    nn.init.zeros_(block.get_parameter(f"{name}.weight"))

    def embed_camera(self, camera: torch.Tensor) -> torch.Tensor:
        """Fold a per-latent-pixel camera map into tokens and embed it (LingBot's model-level path).

        Parameters
        ----------
        camera : Tensor ``[B, camera_dim, F, H, W]``
            Camera channels on the latent grid (LingBot: Plucker rays folded per 8x8 pixels).

        Returns
        -------
        Tensor ``[B, L, dim]``, tokens frame-major; per token the channels are ordered
        (camera channel, patch t, patch h, patch w).
        """
        b, c, f, h, w = camera.shape
        pt, ph, pw = self.cfg.patch_size
        folded = camera.reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw)
        folded = folded.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, (f // pt) * (h // ph) * (w // pw), -1)
        emb = self.patch_embedding_wancamctrl(folded)
        return emb + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(emb)))

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        positions: torch.Tensor,
        attention: Attention,
        text: torch.Tensor | None = None,
        camera: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict ``x0`` for every latent frame of ``x``.

        Parameters
        ----------
        x : Tensor ``[B, C_in, F, H, W]``
            Noisy latents (a chunk, or a whole teacher-forced sequence of chunks along ``F``).
        t : Tensor ``[B, F]``
            Flow-matching time of each latent frame, in [0, 1] (``timestep / 1000``).
        positions : Tensor ``[L, 3]`` or ``[B, L, 3]``
            RoPE (t, h, w) position of each token, ``L = (F / pt) * (H / ph) * (W / pw)``.
        attention : Attention
            The KV cache at inference, :class:`BlockCausalAttention` in training.
        text : Tensor ``[B, S, text_dim]`` or None
            Text encoder states (required iff the config has ``text_dim``).
        camera : Tensor ``[B, camera_dim, F, H, W]`` or None
            Camera map (required iff the config has ``camera_dim``).

        Returns
        -------
        Tensor ``[B, C_out, F, H, W]``
        """
        cfg = self.cfg
        if (text is None) != (cfg.text_dim is None):
            raise ValueError("text conditioning must be given exactly when the config has text_dim")
        if (camera is None) != (cfg.camera_dim is None):
            raise ValueError("camera conditioning must be given exactly when the config has camera_dim")
        b, _, f, h, w = x.shape
        pt, ph, pw = cfg.patch_size
        gf, gh, gw = f // pt, h // ph, w // pw
        tokens = self.patch_embedding(x).flatten(2).transpose(1, 2)
        split = self.sequence
        if split is not None:  # this rank's slice of every frame's tokens; attention through the all-to-alls
            from cmbench.parallel.sequence import UlyssesAttention

            tokens = split.shard(tokens, gf)
            positions = split.shard(positions, gf, dim=-2)
            attention = UlyssesAttention(attention, split)

        t_frames = t[:, ::pt].to(x.device)
        e = self.time_embedding(sinusoidal_embedding(1000.0 * t_frames.reshape(-1), cfg.freq_dim).to(x.device))
        e = e.float().reshape(b, gf, cfg.dim)
        e0 = self.time_projection(e).unflatten(-1, (6, cfg.dim))

        cos, sin = self.rope.cos_sin(positions.reshape(-1, 3).cpu())
        cos = cos.reshape(*positions.shape[:-1], -1).to(x.device)
        sin = sin.reshape(*positions.shape[:-1], -1).to(x.device)
        text_ctx = self.text_embedding(text) if text is not None else None
        cam = self.embed_camera(camera).to(tokens.dtype) if camera is not None else None
        if split is not None and cam is not None:
            cam = split.shard(cam, gf)
        if self.residual_dtype is not None:
            tokens = tokens.to(self.residual_dtype)
        for layer, block in enumerate(self.blocks):
            tokens = block(tokens, e0, cos, sin, attention, layer, text_ctx, cam)

        out = self.head(tokens, e)
        if split is not None:
            out = split.gather(out, gf)  # every rank gets the whole prediction (methods decide from it)
        out = out.reshape(b, gf, gh, gw, pt, ph, pw, cfg.out_channels)
        return out.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(b, cfg.out_channels, f, h, w)
