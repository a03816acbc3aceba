"""Pruning ratio at LingBot World v2's scale on a CPU: the real cache runtime, every method, a stand-in signal.

The paper's Table 1 PR column needs no model: Eq. 4 counts the history positions each layer-head
sees, which the methods' rules fix once the geometry is LingBot's. This module runs the real
generation loop, KV cache, ledger and every registered method at that geometry

- 1560 tokens per latent frame (a 30 x 52 token grid), chunks of 4 latent frames;
- a one-minute 16-fps context: 961 pixel frames = 241 latent frames, padded to 244 (whole chunks,
  as the authors' runtime pads by repeating the last frame); 16 continuation latent frames;
- 40 layers x 40 heads as head groups, with the LingBot head map's proportion for the head-split
  methods: 232 static of 1,600 layer-heads, layer 0 all dynamic;

with a *stand-in backbone* (:class:`StandIn`) instead of the model: it writes synthetic keys and
values of a few channels through ``cache.attend`` and predicts ``x0`` from a stand-in signal, and the
cache skips the attention arithmetic (``GenerationSettings(compute_attention=False)``), so a
minute-long context runs in seconds on one CPU thread.

Fewer layers and heads where the PR cannot depend on them (:data:`PLAN`): every method but the
head-split ones, ForcingKV and DummyForcing applies one decision to every layer-head, so two layers of
two heads (layer 1 holds the keys TempDiff scores) give the same PR as 40 x 40; the head-split methods
run 5 layers x 40 heads, which holds the LingBot map's proportion exactly (29 of 200 static, layer 0
dynamic), and their PR depends on that proportion only; ForcingKV streams layer 0 (one layer in 40)
and gives every other head one decision, so it runs 40 layers of a few heads; DummyForcing's PR depends only on the
fraction of layer-heads in each role (half are dummy by rule; the first / middle split is the data's).
:func:`pr_table` reruns every method at a second layer / head count to show it.

Stand-in signals (:class:`StandIn`): ``keys="iid"`` draws every token's key independently (no
temporal structure: which blocks or patches look redundant is random); ``keys="drift"`` adds noise
that grows along the video to a fixed key per position (later frames change more: the least similar
patches are the newest, the case where ForcingKV's picks overlap its recent window most). DeCoPrune's
score is ``2 gamma`` for a seeded ``novel_fraction`` of the tokens and ``gamma / 2`` for the rest, in
context and continuation alike. Rules that fix the count (Streaming, TempDiff's K blocks,
DummyForcing's half of the heads, ForcingKV's K patches) give a PR the signal cannot move (TempDiff,
Streaming) or moves only through overlaps with windows they keep anyway (ForcingKV) or the first /
middle split (DummyForcing); DeCoPrune's family keeps what the threshold keeps, i.e. the signal's
``novel_fraction``: its PR here describes the stand-in, not the paper's data.
"""

from __future__ import annotations

import csv
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from cmbench.backbones.base import Geometry
from cmbench.cache import KVCache
from cmbench.cache.rope import RopeAxis, RopeSpec
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.hashing import seeded_generator
from cmbench.methods.head_map import HeadMap
from cmbench.methods.registry import build_method, method_names

# The paper's Table 1 (LingBot World v2, CMBench): PR per method, in percent
PAPER_PR = {"fullkv": 0.00, "streaming": 94.37, "dummyforcing": 98.03, "forcingkv": 80.62, "tempdiff": 86.36,
            "decoprune": 85.43, "decoprune_hs": 86.19, "random": 85.31, "decoprune_reverse": 18.79}
TARGETS = ("streaming", "dummyforcing", "forcingkv", "tempdiff")  # the rule fixes their count: within 1 point
TOLERANCE = 1.0  # percentage points
LINGBOT_STATIC = (232, 1600)  # static layer-heads of the LingBot head map (layer 0 all dynamic)

HEAD_SPLIT = ("decoprune_hs",)
# method -> (layers, heads) of the main run and of the second run showing the PR does not depend on them
PLAN: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    **{name: ((5, 40), (10, 20)) for name in HEAD_SPLIT},  # 29 of 200 static: the LingBot proportion
    "forcingkv": ((40, 2), (40, 3)),  # layer 0 streams: the LingBot proportion of layers
    "dummyforcing": ((2, 8), (4, 8)),  # roles by fraction; its attention statistics cost ~ layer-heads
}
UNIFORM = ((2, 2), (3, 5))  # one decision for every layer-head


@dataclass(frozen=True)
class Scale:
    """The geometry and timeline of the run (LingBot World v2 by default).

    Attributes
    ----------
    token_rows, token_cols : int
        Token grid of a latent frame (30 x 52 = 1560 tokens).
    chunk_frames : int
        Latent frames per chunk.
    pixel_frames : int
        Context length in pixel frames at 16 fps (one minute: 961, the first frame included).
    continuation_frames : int
        Latent frames generated.
    temporal_stride : int
        The VAE's temporal compression.
    """

    token_rows: int = 30
    token_cols: int = 52
    chunk_frames: int = 4
    pixel_frames: int = 961
    continuation_frames: int = 16
    temporal_stride: int = 4

    @property
    def latent_frames(self) -> int:
        """Latent frames of the context before padding (``(pixels + 2 s - 2) // s``: 241)."""
        return (self.pixel_frames + 2 * self.temporal_stride - 2) // self.temporal_stride

    @property
    def context_frames(self) -> int:
        """Latent frames of the context padded to whole chunks (244)."""
        return math.ceil(self.latent_frames / self.chunk_frames) * self.chunk_frames

    def geometry(self, layers: int, heads: int, head_dim: int = 2) -> Geometry:
        """A geometry of this token grid (one latent channel, patch 1x2x2, temporal RoPE only)."""
        rope = RopeSpec(RopeAxis(head_dim), RopeAxis(0), RopeAxis(0))
        return Geometry(layers, heads, head_dim, 1, 2 * self.token_rows, 2 * self.token_cols, rope, (1, 2, 2),
                        self.chunk_frames)


def proportional_head_map(layers: int, heads: int, static: tuple[int, int] = LINGBOT_STATIC) -> HeadMap:
    """A head map with ``static[0] / static[1]`` of all layer-heads static, none in layer 0, spread
    evenly over the other layers.

    Raises
    ------
    ConfigError
        The layer-heads cannot hold the proportion exactly.
    """
    count, total = static
    if (layers * heads * count) % total or layers < 2:
        raise ConfigError(f"{layers} x {heads} layer-heads cannot hold {count} / {total} static exactly")
    n_static = layers * heads * count // total
    per_layer = [n_static // (layers - 1) + (i < n_static % (layers - 1)) for i in range(layers - 1)]
    if max(per_layer) > heads:
        raise ConfigError(f"{n_static} static heads do not fit in {layers - 1} layers of {heads}")
    return HeadMap(layers, heads, ((), *(tuple(range(n)) for n in per_layer)))


class StandIn:
    """A backbone that writes stand-in keys and predicts a stand-in ``x0`` (see the module docstring).

    Parameters
    ----------
    geometry : Geometry
    keys : {"iid", "drift"}
        The key signal of the ``t = 0`` pass, drawn per layer (other calls write zeros: their K/V never
        become history); queries and values equal the keys.
    novel_fraction : float
        Tokens whose DeCoPrune score is ``2 * gamma`` (the rest score ``gamma / 2``).
    gamma : float
        DeCoPrune's threshold the scores are placed around.
    probe_level : float
        Noise level of DeCoPrune's probe step: predictions at or above it carry the discrepancy.
    total_frames : int
        Latent frames of context and continuation (the drift's scale).
    seed : int
    """

    def __init__(self, geometry: Geometry, keys: str = "iid", novel_fraction: float = 0.10, gamma: float = 0.10,
                 probe_level: float = 0.899, total_frames: int = 260, seed: int = 0) -> None:
        if keys not in ("iid", "drift"):
            raise ConfigError(f"stand-in keys must be 'iid' or 'drift', got {keys!r}")
        self.geometry, self.keys, self.seed = geometry, keys, seed
        self.novel_fraction, self.gamma, self.probe_level = novel_fraction, gamma, probe_level
        self.total_frames = total_frames
        g = geometry
        self.base = torch.randn(g.num_layers, g.tokens_per_frame, g.num_heads, g.head_dim,
                                generator=seeded_generator(seed, "base"))

    def condition(self, task: Any) -> None:
        return None

    def frame_keys(self, frame_start: int, frames: int, layer: int) -> torch.Tensor:
        """Keys of one layer for frames ``frame_start ..`` at the ``t = 0`` pass, ``[1, frames * T, H, D]``."""
        g = self.geometry
        noise = torch.randn(frames, g.tokens_per_frame, g.num_heads, g.head_dim,
                            generator=seeded_generator(self.seed, "keys", layer, frame_start))
        if self.keys == "drift":
            scale = torch.arange(frame_start, frame_start + frames, dtype=torch.float32) / self.total_frames
            noise = self.base[layer] + scale[:, None, None, None] * noise
        return noise.reshape(1, frames * g.tokens_per_frame, g.num_heads, g.head_dim)

    def discrepancy(self, frame_start: int, frames: int) -> torch.Tensor:
        """``[1, 1, frames, h, w]``: ``sqrt(2 gamma)`` on novel tokens, ``sqrt(gamma / 2)`` elsewhere."""
        g = self.geometry
        novel = torch.rand(frames, g.token_rows, g.token_cols, generator=seeded_generator(self.seed, "d", frame_start))
        d = torch.where(novel < self.novel_fraction, math.sqrt(2 * self.gamma), math.sqrt(self.gamma / 2))
        return d.repeat_interleave(2, 1).repeat_interleave(2, 2)[None, None]

    def denoise(self, x_t: torch.Tensor, t: float, cache: KVCache, frame_start: int, cond: Any = None) -> torch.Tensor:
        g, frames = self.geometry, x_t.shape[2]
        zeros = torch.zeros(1, frames * g.tokens_per_frame, g.num_heads, g.head_dim)
        for layer in range(g.num_layers):
            k = self.frame_keys(frame_start, frames, layer) if t == 0.0 else zeros
            cache.attend(layer, k, k, k)
        if t >= self.probe_level - 1e-9:
            return self.discrepancy(frame_start, frames)
        return torch.zeros_like(x_t)


def measure(name: str, scale: Scale, layers: int, heads: int, keys: str, seed: int = 0,
            knobs: dict[str, Any] | None = None) -> float:
    """PR (Eq. 4, percent) of one method over one context and continuation at ``layers x heads``."""
    geometry = scale.geometry(layers, heads)
    cfg: dict[str, Any] = {"name": name, **(knobs or {})}
    with tempfile.TemporaryDirectory() as folder:
        if (name in HEAD_SPLIT and "head_map" not in cfg) or cfg.get("head_map") == LINGBOT_MAP:
            path = Path(folder) / "head_map.json"
            proportional_head_map(layers, heads).save(path)
            cfg["head_map"] = str(path)
        method = build_method(cfg)
        total = scale.context_frames + scale.continuation_frames
        backbone = StandIn(geometry, keys=keys, total_frames=total, seed=seed)
        context = torch.zeros(1, 1, scale.context_frames, geometry.latent_height, geometry.latent_width)
        settings = GenerationSettings(compute_attention=False)
        pre = prefill(backbone, method, context, None, seed, settings)
        cont = continue_task(backbone, pre, None, scale.continuation_frames, seed + 1)
    return 100.0 * cont.ledger.pruning_ratio()


@dataclass
class Row:
    """One method's results (PR in percent)."""

    method: str
    paper_pr: float | None
    pr: float
    layers_heads: str
    pr_other_layers_heads: float
    other_layers_heads: str
    pr_drift_keys: float
    target: bool
    seconds: float

    @property
    def difference(self) -> float | None:
        return None if self.paper_pr is None else self.pr - self.paper_pr

    @property
    def within(self) -> bool | None:
        return None if not self.target or self.difference is None else abs(self.difference) <= TOLERANCE

    def as_csv(self) -> dict[str, Any]:
        diff = self.difference
        return {"method": self.method, "paper_pr": "" if self.paper_pr is None else f"{self.paper_pr:.2f}",
                "pr": f"{self.pr:.2f}", "difference": "" if diff is None else f"{diff:+.2f}",
                "target": "yes" if self.target else "no", "within_1pt": "" if self.within is None else
                ("yes" if self.within else "no"), "layers_x_heads": self.layers_heads,
                "pr_other_layers_heads": f"{self.pr_other_layers_heads:.2f}",
                "other_layers_x_heads": self.other_layers_heads, "pr_drift_keys": f"{self.pr_drift_keys:.2f}",
                "seconds": f"{self.seconds:.1f}"}


LINGBOT_MAP = "lingbot-proportion"
"""A ``head_map`` knob value standing for :func:`proportional_head_map` at the run's layer-heads."""

VARIANTS: dict[str, tuple[str, dict[str, Any], tuple[tuple[int, int], tuple[int, int]]]] = {
    "forcingkv (LingBot head map, layer 0 as the map)": ("forcingkv", {"head_map": LINGBOT_MAP, "layer_zero": "map"},
                                                         PLAN["decoprune_hs"]),
    "forcingkv (all heads dynamic)": ("forcingkv", {"head_map": None, "layer_zero": "map"}, UNIFORM),
}
"""Reference rows beside the registered methods: label -> (method, knobs, layer-heads of the two runs)."""


def pr_table(scale: Scale | None = None, methods: list[str] | None = None, seed: int = 0,
             progress: Callable[[str], None] | None = None) -> list[Row]:
    """Every method (default: all registered, then :data:`VARIANTS`) at ``scale``: PR with the iid
    stand-in at its :data:`PLAN` layer-heads, at the second layer-head count, and with drifting keys."""
    scale = scale or Scale()
    labels = methods or [*method_names(), *VARIANTS]
    rows = []
    for label in labels:
        name, knobs, plan = VARIANTS.get(label, (label, {}, PLAN.get(label, UNIFORM)))
        if name not in method_names():
            raise ConfigError(f"unknown method {name!r}; known: {', '.join(method_names())}")
        (layers, heads), (other_layers, other_heads) = plan
        start = time.perf_counter()
        pr = measure(name, scale, layers, heads, "iid", seed, knobs)
        other = measure(name, scale, other_layers, other_heads, "iid", seed, knobs)
        drift = measure(name, scale, layers, heads, "drift", seed, knobs)
        row = Row(label, PAPER_PR.get(label), pr, f"{layers}x{heads}", other, f"{other_layers}x{other_heads}", drift,
                  label in TARGETS, time.perf_counter() - start)
        rows.append(row)
        if progress is not None:
            progress(f"{label}: PR {pr:.2f}% (paper {'-' if row.paper_pr is None else f'{row.paper_pr:.2f}%'}), "
                     f"{row.other_layers_heads}: {other:.2f}%, drifting keys: {drift:.2f}% ({row.seconds:.0f} s)")
    return rows


def write_csv(rows: list[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0].as_csv()))
        writer.writeheader()
        writer.writerows(r.as_csv() for r in rows)


def markdown(rows: list[Row], scale: Scale) -> str:
    """The README table: paper PR beside ours, the difference, and the two independence checks."""
    lines = [
        f"| Method | Paper PR | CMBench PR | Difference | Target (within {TOLERANCE:.0f} pt) | layers x heads | "
        "PR at other layers x heads | PR with drifting keys |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        c = r.as_csv()
        paper = f"{c['paper_pr']}%" if c["paper_pr"] else "—"
        diff = c["difference"] or "—"
        target = {"yes": "yes", "no": "**no**", "": "—"}[c["within_1pt"]] if r.target else "not a target"
        lines.append(f"| {r.method} | {paper} | {c['pr']}% | {diff} | {target} | {r.layers_heads} | "
                     f"{c['pr_other_layers_heads']}% ({r.other_layers_heads}) | {c['pr_drift_keys']}% |")
    lines.append("")
    lines.append(f"Context {scale.pixel_frames} pixel frames = {scale.latent_frames} latent frames, padded to "
                 f"{scale.context_frames}; {scale.continuation_frames} continuation frames; "
                 f"{scale.token_rows}x{scale.token_cols} tokens per frame; chunks of {scale.chunk_frames}.")
    return "\n".join(lines)
