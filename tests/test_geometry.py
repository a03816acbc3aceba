"""Geometry.tokenize: the token order the cache, methods and position ids share (frame-major, then row, then
column; channel-major inside a token), checked value by value on a non-square grid and batch 2."""

from __future__ import annotations

import pytest
import torch

from cmbench.backbones.base import Geometry
from cmbench.cache.rope import RopeAxis, RopeSpec
from fakes import untokenize


def _geometry() -> Geometry:
    # 2 channels, a 4x6 latent frame, patch 2x3: a 2x2 token grid of 12 values per token, 4 tokens per frame
    return Geometry(1, 1, 6, 2, 4, 6, RopeSpec(RopeAxis(2), RopeAxis(2), RopeAxis(2)), (1, 2, 3), 2)


def test_tokens_are_frame_major_then_row_then_column_with_channel_major_values():
    g = _geometry()
    b, c, f, h, w = 2, g.latent_channels, 3, g.latent_height, g.latent_width
    latents = torch.arange(b * c * f * h * w, dtype=torch.float32).reshape(b, c, f, h, w)
    tokens = g.tokenize(latents)
    assert tokens.shape == (b, f * g.tokens_per_frame, g.values_per_token) == (2, 12, 12)
    for batch in range(b):
        for frame in range(f):
            for row in range(g.token_rows):
                for col in range(g.token_cols):
                    token = frame * g.tokens_per_frame + row * g.token_cols + col
                    block = latents[batch, :, frame, 2 * row : 2 * row + 2, 3 * col : 3 * col + 3]  # [C, ph, pw]
                    assert torch.equal(tokens[batch, token], block.reshape(-1)), (batch, frame, row, col)


def test_untokenize_of_tokenize_is_the_identity():
    g = _geometry()
    latents = torch.randn(2, g.latent_channels, 3, g.latent_height, g.latent_width, generator=torch.Generator().manual_seed(0))
    assert torch.equal(untokenize(g, g.tokenize(latents), 3), latents)


@pytest.mark.parametrize("shape", [(2, 2, 3, 4), (2, 3, 3, 4, 6), (2, 2, 3, 4, 7), (2, 2, 3, 5, 6)])
def test_latents_of_another_shape_are_refused_naming_the_expected_one(shape):
    with pytest.raises(ValueError, match=r"latents must be \[B, 2, f, 4, 6\], got"):
        _geometry().tokenize(torch.zeros(shape))
