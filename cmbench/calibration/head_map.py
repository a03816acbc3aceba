"""Head maps from FullKV attention: which heads look only at the recent past (static) and which reach back.

DeCoPrune-HS and ForcingKV split heads into static (sink + recent window) and dynamic ones from an
offline map computed here on calibration contexts (the paper: 15 videos). The map's format and the
static/dynamic rule live in :mod:`cmbench.methods.head_map`; this module runs the generation loop
to measure the attention they are computed from.
"""

from __future__ import annotations

import torch

from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods.fullkv import FullKV
from cmbench.methods.head_map import ratio, static_masses

PAPER_LINGBOT_STATIC = (232, 40, 40)  # the paper's LingBot World v2 map: 232 static of 40 layers x 40 heads


def calibrate_head_scores(backbone, contexts, settings: GenerationSettings | None = None, first: int = 4,
                          last: int = 4) -> torch.Tensor:
    """DeCoPrune-HS / ForcingKV head scores from FullKV attention at the first continuation call.

    For each calibration context: prefill with FullKV and record the attention of the first denoising
    call of the first generated chunk. ``s(l, h)`` = mass on the last ``last`` context frames / mass on
    all context frames but the first ``first``, pooled over the contexts as the paper's Appendix B
    defines it: the sum of the numerators over the sum of the denominators
    (:func:`cmbench.methods.head_map.static_masses`).

    Parameters
    ----------
    backbone : Backbone
    contexts : iterable of ``(latents [B, C, F, h, w], cond, seed)``
        Calibration contexts (the paper uses 15 videos).
    settings : GenerationSettings, optional

    Returns
    -------
    Tensor, shape ``[num_layers, num_heads]``: pooled ``s`` (``nan`` where every denominator is zero).
    """
    numerators, denominators = [], []
    for latents, cond, seed in contexts:
        pre = prefill(backbone, FullKV(), latents, cond, seed, settings)
        cont = continue_task(backbone, pre, cond, backbone.geometry.chunk_frames, seed, record_attention_at=(0,))
        numerator, denominator = static_masses(cont.attention[0].stacked(), pre.context_frames, first, last)
        numerators.append(numerator)
        denominators.append(denominator)
    if not numerators:
        raise ConfigError("head-map calibration needs at least one context")
    return ratio(torch.stack(numerators).sum(0), torch.stack(denominators).sum(0))


def paper_check(num_static: int, num_layers: int, num_heads: int) -> str:
    """The map's static count beside the paper's LingBot World v2 map (232 static of 40 x 40 = 1,600)."""
    static, layers, heads = PAPER_LINGBOT_STATIC
    if (num_layers, num_heads) != (layers, heads):
        return (f"check: the paper's LingBot World v2 map has {static} static of {layers * heads} layer-heads; "
                f"this backbone has {num_layers} x {num_heads}, so there is no paper count to compare")
    verdict = "matches" if num_static == static else f"differs by {num_static - static:+d}"
    return f"check: {num_static} static of {layers * heads} layer-heads; the paper's LingBot map: {static} ({verdict})"
