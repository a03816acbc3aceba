"""DeCoPrune probing at the last step of the schedule: the paper's probe step 3 (timestep 702).

On a seeded random tiny model (the tiny backbone's architecture: 12 latent channels, 16 x 16 latents,
2 x 2 patches, so 64 tokens of 48 values per frame, chunks of 4 frames) with a 3-chunk context and a
4-chunk continuation:

- a context chunk is re-noised to ``t = 0.702`` with its seeded probe noise, predicted once against the
  history its probe sees, and scored against the observed chunk: checked against the same prediction
  made on a cache written by hand and its token MSE computed patch by patch;
- a generated chunk's ``x0`` at the last step is its final ``x0``: every score is 0 (``cosine``: 1), so
  the threshold keeps none of its tokens once it leaves the dense window, as the authors' harness does;
- a step past the schedule is refused in one line naming ``method.probe_step``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cmbench.backbones.tiny import CameraPlan, TinyWorldModel
from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.generation.loop import check_settings
from cmbench.generation.sampler import DEFAULT_TIMESTEPS
from cmbench.hashing import seeded_generator
from cmbench.methods import build_method

BACKBONE = TinyWorldModel.random(0)
G = BACKBONE.geometry
CONTEXT_CHUNKS, GENERATED_CHUNKS, SEED = 3, 4, 5
F = G.chunk_frames
FRAMES = (CONTEXT_CHUNKS + GENERATED_CHUNKS) * F
LATENTS = torch.rand(1, G.latent_channels, FRAMES, G.latent_height, G.latent_width,
                     generator=torch.Generator().manual_seed(1)) * 2 - 1
PLAN = CameraPlan((np.arange(FRAMES) * 4) % 256)
LAST = len(DEFAULT_TIMESTEPS) - 1  # 3: timestep 702


def by_hand_token_mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean over batch, channels and the 2 x 2 latent patch of ``(a - b) ** 2``, per token.

    Parameters
    ----------
    a, b : Tensor, shape ``[B, 12, f, 16, 16]``

    Returns
    -------
    Tensor, shape ``[f * 64]``: frame-major, then token row, then token column.
    """
    d = (a.double() - b.double()) ** 2
    B, C, f, h, w = d.shape
    patches = d.reshape(B, C, f, h // 2, 2, w // 2, 2)
    return patches.mean(dim=(0, 1, 4, 6)).reshape(-1)


def run(method_cfg: dict):
    """Prefill the context and generate the continuation; per chunk, the scores the method computed and
    whether its probe ``x0`` was the very tensor of its final ``x0``."""
    method = build_method(method_cfg)
    seen: dict[int, tuple[torch.Tensor, bool]] = {}

    def hook(cache, sig) -> None:
        seen[sig.chunk.index] = (method.token_scores(sig), sig.x0_probe is sig.x0_final)

    context = LATENTS[:, :, : CONTEXT_CHUNKS * F]
    pre = prefill(BACKBONE, method, context, PLAN, SEED, on_chunk_end=hook)
    cont = continue_task(BACKBONE, pre, PLAN, GENERATED_CHUNKS * F, SEED + 1, on_chunk_end=hook)
    return seen, cont


def test_a_context_chunk_probed_at_702_scores_the_renoised_prediction_against_the_clean_chunk():
    seen, _ = run({"name": "decoprune", "probe_step": LAST})
    t = DEFAULT_TIMESTEPS[LAST] / 1000.0
    assert t == pytest.approx(0.702)
    # by hand: chunks 0 .. c - 1 written clean (DeCoPrune compacts chunk i only before chunk i + 2's t = 0
    # pass, so the probes of chunks 1 and 2 see every earlier chunk dense), then chunk c re-noised
    cache = KVCache.from_geometry(G)
    with torch.no_grad():  # as the loop runs the model
        for c in range(CONTEXT_CHUNKS):
            x0 = LATENTS[:, :, c * F : (c + 1) * F]
            cache.begin_chunk(c, c * F, F)
            if c:
                noise = torch.randn(x0.shape, generator=seeded_generator(SEED, "context-probe", c))
                with cache.probe():
                    predicted = BACKBONE.denoise((1 - t) * x0 + t * noise, t, cache, c * F, PLAN)
                expected = by_hand_token_mse(predicted, x0)
                assert float(expected.min()) > 0  # a real discrepancy, not the generated chunks' zero
                torch.testing.assert_close(seen[c][0].double(), expected, rtol=1e-5, atol=1e-7)
                assert not seen[c][1]  # its own prediction, not the observed chunk
            BACKBONE.denoise(x0, 0.0, cache, c * F, PLAN)
            cache.commit_chunk()


@pytest.mark.parametrize("score, zero", [("mse", 0.0), ("cosine", 1.0)])
def test_a_generated_chunk_at_the_last_step_scores_its_final_x0_against_itself(score, zero):
    """gamma = 0: every context token with a positive MSE is kept, no generated token is (score 0 is not
    above 0; a cosine of 1 is not at most 0)."""
    seen, cont = run({"name": "decoprune", "probe_step": LAST, "gamma": 0.0, "score": score})
    generated = range(CONTEXT_CHUNKS, CONTEXT_CHUNKS + GENERATED_CHUNKS)
    for c in generated:
        scores, same_tensor = seen[c]
        assert same_tensor
        torch.testing.assert_close(scores, torch.full_like(scores, zero))
    # the delayed window (2 chunks) has let go of generated chunks 3 and 4: nothing of them stays
    kept = cont.kept_tokens
    assert [kept[c] for c in generated] == [0, 0, G.tokens_per_chunk, G.tokens_per_chunk]
    if score == "mse":  # the context's scores are positive: gamma = 0 keeps all of it
        assert [kept[c] for c in range(CONTEXT_CHUNKS)] == [G.tokens_per_chunk] * CONTEXT_CHUNKS


def test_a_probe_step_past_the_schedule_is_refused_in_one_line_naming_the_key():
    method = build_method({"name": "decoprune", "probe_step": 4})
    with pytest.raises(ConfigError) as err:
        check_settings(method, GenerationSettings())
    message = str(err.value)
    assert "\n" not in message
    assert message == ("decoprune: method.probe_step=4 names no step of the 4-step schedule "
                       "(999.0, 957.0, 899.0, 702.0): it must be 0 .. 3 (zero-based)")
    with pytest.raises(ConfigError, match="method.probe_step=4"):
        prefill(BACKBONE, method, LATENTS[:, :, :F], PLAN, SEED)
    check_settings(build_method({"name": "decoprune", "probe_step": LAST}), GenerationSettings())  # accepted
