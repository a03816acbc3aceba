"""Test doubles: a fake geometry, a small real attention backbone and a scripted backbone.

Both backbones call ``cache.attend`` for every layer exactly like a real DiT, so cache, method and
generation tests exercise the real contract.
"""

from __future__ import annotations

import torch

from cmbench.backbones.base import Geometry
from cmbench.cache.rope import RopeAxis, RopeSpec, apply_rotary


def fake_geometry(num_layers: int = 2, num_heads: int = 2, head_dim: int = 12, channels: int = 3,
                  height: int = 4, width: int = 4, chunk_frames: int = 2) -> Geometry:
    """A tiny geometry: by default 2x2 tokens per frame (4 tokens), chunks of 2 frames (8 tokens).

    RoPE: ``head_dim // 3`` channels per axis, log rule, temporal first.
    """
    third = 2 * (head_dim // 6)
    rope = RopeSpec(RopeAxis(head_dim - 2 * third), RopeAxis(third), RopeAxis(third))
    return Geometry(num_layers, num_heads, head_dim, channels, height, width, rope, (1, 2, 2), chunk_frames)


def token_positions(geometry: Geometry, frame_start: int, frames: int) -> torch.Tensor:
    """``[frames * tokens_per_frame, 3]`` (t, row, col) of a chunk's tokens, frame-major."""
    t = torch.arange(frame_start, frame_start + frames)
    r = torch.arange(geometry.token_rows)
    c = torch.arange(geometry.token_cols)
    grid = torch.stack(torch.meshgrid(t, r, c, indexing="ij"), dim=-1)
    return grid.reshape(-1, 3)


def untokenize(geometry: Geometry, tokens: torch.Tensor, frames: int) -> torch.Tensor:
    """Inverse of ``geometry.tokenize``: ``[B, L, C*ph*pw] -> [B, C, f, h, w]``."""
    b = tokens.shape[0]
    _, ph, pw = geometry.patch
    c = geometry.latent_channels
    x = tokens.reshape(b, frames, geometry.token_rows, geometry.token_cols, c, ph, pw)
    return x.permute(0, 4, 1, 2, 5, 3, 6).reshape(b, c, frames, geometry.latent_height, geometry.latent_width)


class AttentionBackbone(torch.nn.Module):
    """A small real attention model: token embedding, ``num_layers`` RoPE self-attention blocks over
    the cache, a linear head predicting ``x0``. Random weights from ``seed``.
    """

    def __init__(self, geometry: Geometry, seed: int = 0) -> None:
        super().__init__()
        self.geometry = geometry
        g = torch.Generator().manual_seed(seed)
        width = geometry.num_heads * geometry.head_dim
        p = geometry.values_per_token

        def w(*shape: int, scale: float) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * scale, requires_grad=False)

        self.w_in = w(p, width, scale=p**-0.5)
        self.w_t = w(width, scale=1.0)
        self.wq = w(geometry.num_layers, width, width, scale=width**-0.5)
        self.wk = w(geometry.num_layers, width, width, scale=width**-0.5)
        self.wv = w(geometry.num_layers, width, width, scale=width**-0.5)
        self.wo = w(geometry.num_layers, width, width, scale=width**-0.5)
        self.w_out = w(width, p, scale=width**-0.5)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``uint8 [F, 2h, 2w, 3]`` -> ``[1, C, F, h, w]`` by averaging 2x2 pixels (first C colours)."""
        x = video.float().permute(3, 0, 1, 2)[: self.geometry.latent_channels] / 127.5 - 1.0
        return torch.nn.functional.avg_pool3d(x[None], (1, 2, 2))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[1, C, F, h, w]`` -> ``uint8 [F, 2h, 2w, 3]`` (nearest upsampling; missing colours 0)."""
        x = latents[0].repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
        rgb = torch.zeros(3, *x.shape[1:])
        rgb[: x.shape[0]] = x
        return ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0)

    def condition(self, task) -> None:
        return None

    def denoise(self, x_t: torch.Tensor, t: float, cache, frame_start: int, cond=None) -> torch.Tensor:
        g = self.geometry
        frames = x_t.shape[2]
        h = g.tokenize(x_t) @ self.w_in + t * self.w_t
        cos, sin = g.rope.cos_sin(token_positions(g, frame_start, frames))
        for layer in range(g.num_layers):
            shape = (h.shape[0], h.shape[1], g.num_heads, g.head_dim)
            q = apply_rotary((h @ self.wq[layer]).reshape(shape), cos, sin)
            k = apply_rotary((h @ self.wk[layer]).reshape(shape), cos, sin)
            v = (h @ self.wv[layer]).reshape(shape)
            o = cache.attend(layer, q, k, v)
            h = h + torch.tanh(o.reshape(h.shape) @ self.wo[layer])
        return untokenize(g, h @ self.w_out, frames)


class ScriptedBackbone:
    """Predicts ``x0_hat = world[frames] + t * discrepancy[frames]`` whatever the cache holds.

    It still calls ``cache.attend`` for every layer (keys/values derived from ``x_t``), so the cache
    fills as with a real model, while scores are known in closed form:

    - generated chunk, probe step ``p``: ``x0_p - x0_final = (t_p - t_last) * discrepancy``;
    - context chunk re-noised to ``t_p`` (observed = ``world``): ``x0_p - observed = t_p * discrepancy``.

    Parameters
    ----------
    world, discrepancy : Tensor, shape ``[1, C, F, h, w]``
        Over the whole timeline (context and continuation frames).
    """

    def __init__(self, geometry: Geometry, world: torch.Tensor, discrepancy: torch.Tensor) -> None:
        self.geometry = geometry
        self.world = world
        self.discrepancy = discrepancy
        self.calls: list[tuple[int, float]] = []

    def condition(self, task) -> None:
        return None

    def denoise(self, x_t: torch.Tensor, t: float, cache, frame_start: int, cond=None) -> torch.Tensor:
        g = self.geometry
        self.calls.append((frame_start, float(t)))
        frames = x_t.shape[2]
        tok = g.tokenize(x_t)  # [B, L, P]
        b, L, p = tok.shape
        width = g.num_heads * g.head_dim
        feat = tok.repeat(1, 1, width // p + 1)[..., :width].reshape(b, L, g.num_heads, g.head_dim)
        for layer in range(g.num_layers):
            cache.attend(layer, feat, feat + layer, feat - layer)
        sl = slice(frame_start, frame_start + frames)
        return self.world[:, :, sl] + t * self.discrepancy[:, :, sl]


def timeline(geometry: Geometry, frames: int, value_of_gid) -> torch.Tensor:
    """Latents ``[1, C, frames, h, w]`` whose token ``gid`` holds ``value_of_gid(gid)``.

    ``value_of_gid`` returns a float (broadcast over the token's values) or a ``[C*ph*pw]`` tensor.
    """
    rows = [torch.as_tensor(value_of_gid(gid), dtype=torch.float32).expand(geometry.values_per_token)
            for gid in range(frames * geometry.tokens_per_frame)]
    return untokenize(geometry, torch.stack(rows)[None], frames)


def survivors(cache, layer: int = 0, bank: int = 0) -> list[int]:
    """Global token ids stored in one bank."""
    return cache.banks[layer][bank].field("gid").tolist()


def assert_bank_holds(bank, gids: list[int], want_k: torch.Tensor, want_v: torch.Tensor, tokens_per_frame: int,
                      chunks: list[int] | None = None) -> None:
    """``bank``'s history is tokens ``gids`` in this order: K/V ``[B, len(gids), heads, D]`` equal to ``want_k`` /
    ``want_v``, and the provenance of tokens numbered frame by frame (frame ``gid // tokens_per_frame``, position
    ``gid % tokens_per_frame``, temporal position the frame as float64) and, when given, chunk indices."""
    k, v = bank.history()
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    gid = torch.tensor(gids, dtype=torch.long)
    assert bank.field("gid").tolist() == gids
    assert bank.field("frame").tolist() == (gid // tokens_per_frame).tolist()
    assert bank.field("pos").tolist() == (gid % tokens_per_frame).tolist()
    assert bank.field("tpos").tolist() == (gid // tokens_per_frame).double().tolist()
    if chunks is not None:
        assert bank.field("chunk").tolist() == chunks
