"""The paper's motivating observation, measured: how well the cache predicts each context chunk.

For every context chunk and every step of the sampler's schedule, the chunk's clean latents are
re-noised to that step's level (one seeded noise per chunk, shared by every arm and step) and
predicted once, and the prediction is compared with the clean chunk per token (the mean squared
difference over the token's latent values, DeCoPrune's score). Three arms:

- ``full``: the cache of a FullKV prefill (every earlier chunk);
- ``method``: the cache of the method's own prefill, as the chunk's ``t = 0`` pass sees it (after the
  method's compaction before that pass);
- ``none``: no history at all (the chunk attends to itself only).

The predictions run inside :meth:`cmbench.cache.KVCache.probe` from the loop's ``on_before_clean`` hook,
so they leave no trace in either prefill. On MiniWorld every token's place on the panorama is known
(:func:`cmbench.miniworld.places.context_places`), which splits a chunk's tokens into

- ``seen_cached``: the place was shown by an earlier chunk and a token showing it is still in the
  method's cache (any bank);
- ``seen_pruned``: shown by an earlier chunk, but no cached token shows it any more;
- ``new``: never shown before.

Data without that ground truth get one group, ``all``. One row per (context, chunk, arm, step, group):
the group's mean token error, its token count and the mean age (chunks since its place was last shown).

DeCoPrune's hypothesis (the paper's Figure 1) is that the error under the retained cache is low and flat
across steps where the cache holds what the chunk shows, and high and steep where it does not:
:func:`verdict` tests the first half at the method's probe step, paired over contexts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from cmbench.cache import ChunkInfo, KVCache
from cmbench.generation import GenerationSettings, prefill
from cmbench.generation.sampler import renoise
from cmbench.hashing import seeded_generator
from cmbench.methods.base import Method
from cmbench.methods.decoprune import token_mse
from cmbench.methods.fullkv import FullKV
from cmbench.paper.criteria import DIAGNOSIS_MARGIN, UNTESTABLE
from cmbench.report.verdicts import DEFICIT, Claim, combined, decide
from cmbench.report.statistics import clustered_mean_ci

ARMS = ("full", "method", "none")
ARM_TITLES = {"full": "full cache", "method": "method's cache", "none": "no history"}
GROUPS = ("seen_cached", "seen_pruned", "new")
NO_TRUTH = "all"
COLUMNS = ("context_id", "chunk", "frame_start", "arm", "step", "timestep", "group", "tokens", "error", "age_chunks")
SUMMARY_COLUMNS = ("arm", "group", "step", "timestep", "error", "ci95", "chunks", "contexts")


def step_errors(backbone, cache: KVCache, x0: torch.Tensor, noise: torch.Tensor, cond: Any,
                levels: tuple[float, ...], history: bool) -> torch.Tensor:
    """Per-token error of the ``x0`` prediction of the open chunk at every noise level.

    Parameters
    ----------
    backbone : Backbone
    cache : KVCache
        With the chunk open (its frames are ``cache.current``).
    x0, noise : Tensor, shape ``[B, C, f, h, w]``
        The chunk's clean latents and its noise.
    cond : Any
        The backbone's conditioning.
    levels : tuple of float
        Noise levels ``t`` in (0, 1].
    history : bool
        ``False``: the prediction sees no history (the chunk only).

    Returns
    -------
    Tensor, shape ``[len(levels), f * tokens_per_frame]``, float32.
    """
    assert cache.current is not None, "the chunk must be open"
    out = []
    for t in levels:
        with cache.probe(history=history):
            predicted = backbone.denoise(renoise(x0, noise, t), t, cache, cache.current.frame_start, cond)
        out.append(token_mse(predicted, x0, backbone.geometry))
    return torch.stack(out)


def cached_places(cache: KVCache, places: np.ndarray) -> set[int]:
    """Places shown by some history token of any bank of ``cache`` (``places``: ``int [F, T]``)."""
    out: set[int] = set()
    for bank in cache.all_banks():
        if bank.n:
            out.update(np.unique(places[bank.field("frame").numpy(), bank.field("pos").numpy()]).tolist())
    return out


def token_groups(places: np.ndarray, info: ChunkInfo, cached: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """The group and age of every token of chunk ``info``.

    Parameters
    ----------
    places : ndarray ``int [F, T]``
        Place of every token of every context frame.
    info : ChunkInfo
    cached : set of int
        Places the method's cache holds now.

    Returns
    -------
    groups : ndarray of str ``[f * T]``: ``seen_cached``, ``seen_pruned`` or ``new``.
    age : ndarray ``float [f * T]``: chunks since the chunk whose frames last showed the place (NaN if new).
    """
    start, stop = info.frame_start, info.frame_end
    chunk_frames = info.num_frames
    now = places[start:stop].reshape(-1)
    last: dict[int, int] = {}
    for frame in range(start):
        for place in np.unique(places[frame]).tolist():
            last[place] = frame
    groups = np.array([("seen_cached" if p in cached else "seen_pruned") if p in last else "new" for p in now.tolist()])
    age = np.array([-(-(start - last[p]) // chunk_frames) if p in last else math.nan for p in now.tolist()],
                   dtype=np.float64)
    return groups, age


@dataclass
class ContextDiagnosis:
    """What one context's two prefills recorded, chunk by chunk.

    Attributes
    ----------
    errors : dict
        ``errors[arm][chunk]``: Tensor ``[steps, L]`` of token errors.
    groups, ages : dict
        ``groups[chunk]``: ndarray of str ``[L]``; ``ages[chunk]``: ndarray ``float [L]``.
    frame_start : dict
        ``frame_start[chunk]``.
    """

    errors: dict[str, dict[int, torch.Tensor]]
    groups: dict[int, np.ndarray]
    ages: dict[int, np.ndarray]
    frame_start: dict[int, int]


def diagnose_context(backbone, method: Method, latents: torch.Tensor, cond: Any, seed: int,
                     settings: GenerationSettings, places: np.ndarray | None) -> ContextDiagnosis:
    """Prefill one context under FullKV and under ``method``, probing every chunk at every step.

    Parameters
    ----------
    backbone : Backbone
    method : Method
    latents : Tensor, shape ``[B, C, F, h, w]``
        The context's latents.
    cond : Any
        ``backbone.condition(task)``.
    seed : int
        The context's seed (the prefill's and the diagnostic noise's).
    settings : GenerationSettings
    places : ndarray ``int [F, T]`` or None
        Ground-truth place of every token (None: no groups, every token in ``all``).

    Returns
    -------
    ContextDiagnosis
    """
    levels = settings.sampler.levels
    noises: dict[int, torch.Tensor] = {}
    found = ContextDiagnosis({arm: {} for arm in ARMS}, {}, {}, {})

    def chunk_of(info: ChunkInfo) -> tuple[torch.Tensor, torch.Tensor]:
        x0 = latents[:, :, info.frame_start : info.frame_end]
        if info.index not in noises:
            noises[info.index] = torch.randn(x0.shape, generator=seeded_generator(seed, "diagnose", info.index)).to(x0)
        return x0, noises[info.index]

    def on_full(cache: KVCache, info: ChunkInfo) -> None:
        x0, noise = chunk_of(info)
        found.errors["full"][info.index] = step_errors(backbone, cache, x0, noise, cond, levels, history=True)
        found.errors["none"][info.index] = step_errors(backbone, cache, x0, noise, cond, levels, history=False)

    def on_method(cache: KVCache, info: ChunkInfo) -> None:
        x0, noise = chunk_of(info)
        found.errors["method"][info.index] = step_errors(backbone, cache, x0, noise, cond, levels, history=True)
        found.frame_start[info.index] = info.frame_start
        length = info.num_frames * backbone.geometry.tokens_per_frame
        if places is None:
            found.groups[info.index] = np.full(length, NO_TRUTH)
            found.ages[info.index] = np.full(length, math.nan)
        else:
            found.groups[info.index], found.ages[info.index] = token_groups(places, info, cached_places(cache, places))

    if places is not None and places.shape[0] < latents.shape[2]:
        raise ValueError(f"ground truth covers {places.shape[0]} frames, the context has {latents.shape[2]} latent frames")
    prefill(backbone, FullKV(), latents, cond, seed, settings, on_before_clean=on_full)
    prefill(backbone, method, latents, cond, seed, settings, on_before_clean=on_method)
    return found


def diagnosis_rows(context_id: str, found: ContextDiagnosis, timesteps: tuple[float, ...]) -> list[dict[str, Any]]:
    """One row per (chunk, arm, step, group present in the chunk): see :data:`COLUMNS`."""
    rows = []
    for chunk, groups in sorted(found.groups.items()):
        for group in [g for g in (*GROUPS, NO_TRUTH) if (groups == g).any()]:
            where = torch.from_numpy(groups == group)
            age = found.ages[chunk][groups == group]
            mean_age = float(np.mean(age)) if not np.isnan(age).all() else math.nan
            for arm in ARMS:
                errors = found.errors[arm][chunk][:, where]  # [steps, tokens of the group]
                for step, timestep in enumerate(timesteps):
                    rows.append({"context_id": context_id, "chunk": chunk, "frame_start": found.frame_start[chunk],
                                 "arm": arm, "step": step, "timestep": float(timestep), "group": group,
                                 "tokens": int(where.sum()), "error": float(errors[step].mean()),
                                 "age_chunks": mean_age})
    return rows


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean error per (arm, group, step) over chunks, with its 95% CI clustered by context."""
    out = []
    for (arm, group, step), part in rows.groupby(["arm", "group", "step"], sort=False):
        mean, half = clustered_mean_ci(part["error"], part["context_id"])
        out.append({"arm": arm, "group": group, "step": int(step), "timestep": float(part["timestep"].iloc[0]),
                    "error": mean, "ci95": half, "chunks": len(part), "contexts": part["context_id"].nunique()})
    table = pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))
    order = {a: i for i, a in enumerate(ARMS)} | {g: i for i, g in enumerate((*GROUPS, NO_TRUTH))}
    return table.sort_values(["arm", "group", "step"], key=lambda c: c.map(order) if c.name != "step" else c,
                             ignore_index=True)


@dataclass(frozen=True)
class Comparison:
    """``a`` minus ``b``: mean paired difference over contexts that have both groups, and its 95% CI."""

    a: str
    b: str
    difference: float
    ci95: float
    contexts: int

    @property
    def claim(self) -> Claim:
        """``a``'s error below ``b``'s: a deficit claim (:mod:`cmbench.report.verdicts`) with the diagnosis's margin."""
        return Claim.of_interval(f"{self.a} − {self.b}", DEFICIT, self.difference, self.ci95, self.contexts,
                                 self.contexts, DIAGNOSIS_MARGIN)

    @property
    def verdict(self) -> str:
        """The claim decided alone; a comparison over fewer than two contexts has no CI and is inconclusive."""
        return decide([self.claim])[0].verdict


def compare_groups(rows: pd.DataFrame, arm: str, step: int, a: str, b: str) -> Comparison:
    """Paired over contexts: each context's mean error of group ``a`` minus that of ``b``."""
    part = rows[(rows["arm"] == arm) & (rows["step"] == step)]
    means = part.groupby(["context_id", "group"])["error"].mean().unstack()
    if a not in means or b not in means:
        return Comparison(a, b, math.nan, math.nan, 0)
    diff = (means[a] - means[b]).dropna()
    if diff.empty:
        return Comparison(a, b, math.nan, math.nan, 0)
    mean, half = clustered_mean_ci(diff.to_numpy(), diff.index.to_numpy())
    return Comparison(a, b, mean, half, len(diff))


def verdict(rows: pd.DataFrame, probe_step: int) -> tuple[str, list[Comparison]]:
    """Whether the hypothesis holds here, and the paired comparisons behind it: the first finding's criterion
    (:data:`cmbench.paper.criteria.CRITERIA`), under the method's cache at ``probe_step``, tokens whose place is
    still cached against pruned and against new ones, decided as one family (:func:`cmbench.report.verdicts.decide`).
    Data without ground truth of what each chunk shows cannot be tested."""
    if not (rows["group"] != NO_TRUTH).any():
        return UNTESTABLE, []
    comparisons = [compare_groups(rows, "method", probe_step, "seen_cached", other) for other in ("seen_pruned", "new")]
    return combined(d.verdict for d in decide([c.claim for c in comparisons])), comparisons


def plot(summary: pd.DataFrame, path: Path, title: str) -> None:
    """Error vs denoising step, one panel per arm, one line per group with its 95% CI band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if (summary["arm"] == a).any()]
    fig, axes = plt.subplots(1, len(arms), figsize=(3.4 * len(arms), 3.4), dpi=120, sharey=True, squeeze=False)
    colours = {"seen_cached": "tab:green", "seen_pruned": "tab:red", "new": "tab:blue", NO_TRUTH: "tab:grey"}
    for ax, arm in zip(axes[0], arms):
        for group in (*GROUPS, NO_TRUTH):
            part = summary[(summary["arm"] == arm) & (summary["group"] == group)].sort_values("step")
            if part.empty:
                continue
            x, y, half = part["step"].to_numpy(), part["error"].to_numpy(), part["ci95"].fillna(0).to_numpy()
            ax.plot(x, y, marker="o", color=colours[group], label=group.replace("_", " "))
            ax.fill_between(x, y - half, y + half, color=colours[group], alpha=0.2, linewidth=0)
        steps = summary.drop_duplicates("step").sort_values("step")
        ax.set_xticks(steps["step"], [f"{s}\n({t:g})" for s, t in zip(steps["step"], steps["timestep"])])
        ax.set_title(ARM_TITLES[arm])
        ax.set_xlabel("denoising step (timestep)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("x0 error vs the clean chunk (token MSE)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`run_diagnosis` measured.

    Attributes
    ----------
    rows : DataFrame
        :data:`COLUMNS`, one row per (context, chunk, arm, step, group).
    summary : DataFrame
        :func:`summarise` of ``rows``.
    verdict : str
    comparisons : list of Comparison
    probe_step : int
        The step the verdict reads (the method's probe step, else the schedule's middle step).
    note : str
        Why the groups are missing, when they are.
    """

    rows: pd.DataFrame
    summary: pd.DataFrame
    verdict: str
    comparisons: list[Comparison]
    probe_step: int
    note: str = ""


def run_diagnosis(spec, on_context: Callable[[int, int, str], None] | None = None) -> Diagnosis:
    """:func:`diagnose_context` over the contexts of a run spec's selected tasks.

    Parameters
    ----------
    spec : RunSpec
        Its method, data, backbone, generation settings, seed and selection (``limit``, ``subset``,
        ``task_ids``); each context is probed once, under its first selected task's conditioning, with
        the context's prefill seed (as ``run`` prefills it).
    on_context : callable ``(done, total, context_id)``, optional
        Progress, called before each context.
    """
    from cmbench.backbones.loading import build_backbone
    from cmbench.backbones.memory.run_plan import plan_run
    from cmbench.data import load_manifest
    from cmbench.data.adapter import build_adapter
    from cmbench.hashing import task_seed
    from cmbench.miniworld.places import context_places
    from cmbench.miniworld.readers import MiniWorldDataError
    from cmbench.runs.evaluator import encode_context
    from cmbench.runs.runner import select_tasks

    adapter = build_adapter(spec.data.config)
    adapter.ensure()
    sel = spec.selection
    tasks = select_tasks(load_manifest(str(spec.data.root), spec.data.manifest), task_ids=sel.task_ids,
                         limit=sel.limit, seed=sel.sample_seed)
    contexts = list({t.context_id: t for t in reversed(tasks)}.values())[::-1]  # first task of each context
    memory = plan_run({"backbone": spec.backbone, "data": spec.data.config, "scorer": spec.scorer,
                       "generation": {"continuation_frames": spec.generation.continuation_frames}}, FullKV())
    backbone = build_backbone(memory.backbone_config)
    settings = spec.generation.settings
    g = backbone.geometry
    rows, notes = [], set()
    for done, task in enumerate(contexts):
        if on_context is not None:
            on_context(done, len(contexts), task.context_id)
        _, latents = encode_context(spec.backbone["context"], adapter, backbone, task)
        places: np.ndarray | None = None
        try:
            places = context_places(task, g.token_rows, g.token_cols)
        except (MiniWorldDataError, ValueError) as err:
            notes.add(f"no ground truth of what each chunk shows: {err}")
        if places is not None and places.shape[0] != latents.shape[2]:
            notes.add(f"{places.shape[0]} context frames but {latents.shape[2]} latent frames (a temporally "
                      "compressing backbone): no per-token ground truth")
            places = None
        found = diagnose_context(backbone, spec.method, latents, backbone.condition(task),
                                 task_seed(sel.seed, task.context_id), settings, places)
        rows += diagnosis_rows(task.context_id, found, settings.sampler.timesteps)
        del found
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    probe = spec.method.needs().probe_step
    probe_step = int(probe) if probe is not None else len(settings.sampler.timesteps) // 2
    said, comparisons = verdict(table, probe_step)
    return Diagnosis(table, summarise(table), said, comparisons, probe_step, "; ".join(sorted(notes)))
