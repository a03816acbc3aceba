"""Continuation speed and memory of every KV-cache method on the tiny backbone, measured in one process.

For each context length (latent frames; 192 is the MiniWorld default, 768 is 4x it):

1. one synthetic MiniWorld context (a seeded scene and camera path: the same frames for every method)
   is prefilled once per method;
2. one untimed *accounting* continuation per method runs through a recording proxy of the backbone:
   every denoising call's visible history per layer-head (-> attention FLOPs and the cost model), the
   realised pruning ratio (paper Eq. 4) and the peak stored K/V bytes from the PR ledger;
3. a cost model of one denoising call, ``T(n) = a + A(n)`` with ``n`` the history keys visible to each
   head, is measured: ``a = T(0)`` from a call with an empty cache, ``A(n)`` from calls against
   FullKV's history cut to its newest 1/64 .. 1/2 and all of it (piecewise-linear in between);
4. timed rounds: each round runs every method's continuation once and the cost-model calls once, in a
   shuffled order, so machine load hits all of them alike (medians over rounds); the process's peak
   RSS is reset before each continuation (``/proc/self/clear_refs``) and read after it;
5. DeCoPrune's keep pattern is replayed as a fixed oracle mask (:class:`cmbench.methods.oracle.OracleMask`)
   in the same rounds and in back-to-back pairs: the difference is what online scoring costs.
6. the retrieval methods (``worldkv``, ``key_retrieval``) keep evicted history in a host store and
   bring chunks back before each chunk: their accounting run also counts the bytes moved host <-> device
   per generated chunk, and a transfer cost model turns them into seconds at a stated bandwidth
   (:data:`PCIE_BYTES_PER_S`). On the CPU the store and the banks share memory, so a "transfer" is an
   in-memory copy, inside the measured continuation time; the modelled seconds are what the same
   bytes would cost over a GPU's host link, not measured here.

Speed-up = median FullKV continuation seconds / median method seconds, both from this run. The ideal
speed-up is the cost model's prediction from the method's measured visibility; "of bound" = measured /
ideal. ``scripts/bench_speed.py`` is the command line around this module (docs/speed.md).
"""

from __future__ import annotations

import csv
import dataclasses
import gc
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from omegaconf import OmegaConf

from cmbench.backbones.tiny import CameraPlan, TinyWorldModel
from cmbench.benchmarks.process_memory import peak_rss_mb, reset_peak_rss, rss_mb
from cmbench.cache import KVCache
from cmbench.config_paths import CONFIG_DIR, to_dict
from cmbench.generation import PrefilledContext, continue_task, prefill
from cmbench.generation.accounting import CallRecorder, attention_flops
from cmbench.hashing import file_hash, seeded_generator
from cmbench.methods.base import Method
from cmbench.methods.oracle import BankIds, KeptIds, OracleMask
from cmbench.methods.registry import build_method
from cmbench.miniworld import render_video, sample_camera_path, sample_scene
from cmbench.provenance import cpu_name, git_commit

REFERENCE = "fullkv"
DECOPRUNE = "decoprune@0.85"
ORACLE = "decoprune@0.85:oracle"
STREAMING = "streaming"

RETRIEVAL_FRAMES = 28
"""The retrieval methods' device budget in the speed rows: 7 stored chunks (of 4 latent frames) brought
back per chunk beside the sink and the 2-chunk recent window, a device PR of about 0.85 at 192 context
frames (the restored chunks are compressed to 2.5 of their 4 frames: ``1 - (3 + 7 * 0.625) / 49.5``);
fixed in frames, so a longer context prunes more."""

PCIE_BYTES_PER_S = 25e9
"""Host <-> device bandwidth of the transfer cost model: PCIe 4.0 x16 (16 GT/s per lane, 16 lanes,
128b/130b encoding: 31.5 GB/s per direction raw), of which pinned-memory copies typically reach about
25 GB/s. Both directions' bytes are charged to one link, with no overlap with compute (an upper bound
on what the transfers add)."""


@dataclass(frozen=True)
class MethodSpec:
    """A method under test: a label and ``configs/method/<name>.yaml`` plus overrides."""

    label: str
    name: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def build(self) -> Method:
        return build_method({**to_dict(OmegaConf.load(CONFIG_DIR / "method" / f"{self.name}.yaml")), **self.overrides})


METHODS = {
    spec.label: spec
    for spec in (
        MethodSpec(REFERENCE, "fullkv"),
        MethodSpec(STREAMING, "streaming"),
        MethodSpec(DECOPRUNE, "decoprune", {"quota_pr": 0.85}),
        MethodSpec("decoprune", "decoprune"),
        MethodSpec("decoprune_reverse@0.85", "decoprune_reverse", {"quota_pr": 0.85}),
        MethodSpec("random@0.85", "random", {"quota_pr": 0.85}),
        MethodSpec("tempdiff", "tempdiff"),
        MethodSpec("forcingkv", "forcingkv"),
        MethodSpec("dummyforcing", "dummyforcing"),
        MethodSpec("worldkv", "worldkv", {"retrieval_frames": RETRIEVAL_FRAMES}),
        MethodSpec("key_retrieval", "key_retrieval", {"retrieval_frames": RETRIEVAL_FRAMES}),
    )
}


# ----------------------------------------------------------------------------------- setup
def build_tiny(weights: Path, seed: int) -> tuple[TinyWorldModel, str]:
    """The trained tiny model if its weights exist, else a seeded random one with the same config
    (:meth:`TinyWorldModel.random`; speed does not depend on the values)."""
    if weights.is_file():
        return TinyWorldModel.from_pretrained(weights), f"trained ({weights.name}, sha256 {file_hash(weights)[:12]})"
    return TinyWorldModel.random(seed), f"random init (seed {seed}; {weights} not found)"


def make_context(backbone: TinyWorldModel, frames: int, continuation: int,
                 seed: int) -> tuple[torch.Tensor, CameraPlan]:
    """A MiniWorld context of ``frames`` latent frames and the camera plan of context + continuation.

    Returns
    -------
    latents : Tensor ``[1, 12, frames, 16, 16]``
    plan : CameraPlan over ``frames + continuation`` frames
    """
    rng = np.random.default_rng([seed, frames])
    scene = sample_scene(rng, "synthetic", backbone.config.world_width)
    cams = sample_camera_path(rng, frames + continuation, width=scene.width)
    video = render_video(scene, cams[:frames])
    return backbone.encode(torch.from_numpy(video)), CameraPlan(cams)


# ----------------------------------------------------------------------------------- cost model
CALIBRATION_FRACTIONS = (0.0, 1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)


@dataclass(frozen=True)
class CostModel:
    """Seconds of one denoising call as a function of ``n``, the history keys visible per head.

    ``T(n) = a + A(n)``: ``a = T(0)`` is everything but attention to history (measured with an empty
    cache), ``A`` the attention over ``n`` history keys, interpolated piecewise-linearly between the
    measured points (and extrapolated along the last segment): the per-key cost of SDPA is not
    constant (long key sequences fall out of the CPU caches), so one slope fitted to all points would
    mispredict short pruned caches.

    Attributes
    ----------
    points : tuple of (int, float)
        ``(n, median seconds)``, increasing ``n``, starting at ``n = 0``.
    """

    points: tuple[tuple[int, float], ...]

    @property
    def a(self) -> float:
        return self.points[0][1]

    @property
    def per_key_at_full(self) -> float:
        """Average seconds per visible key per head at the longest point, ``(T(N) - a) / N``."""
        n, t = self.points[-1]
        return (t - self.a) / n

    def seconds(self, n: float) -> float:
        ns = [p[0] for p in self.points]
        ts = [p[1] for p in self.points]
        if n <= ns[-1]:
            return float(np.interp(n, ns, ts))
        return ts[-1] + (n - ns[-1]) * (ts[-1] - ts[-2]) / (ns[-1] - ns[-2])

    def continuation(self, calls: list[int], heads: int) -> float:
        """Predicted seconds of the model calls of a continuation (``calls``: totals over layer-heads)."""
        return sum(self.seconds(c / heads) for c in calls)


class CostProbe:
    """Single denoising calls against no history and against the newest 1/64 .. all of FullKV's.

    Each point is a fork of the FullKV prefill cut to its newest ``fraction`` of history, with the
    first generated chunk open; the calls overwrite that chunk's slot, so they can repeat. One
    :meth:`measure` per timed round, so the model sees the same machine load as the continuations.
    """

    def __init__(self, backbone, full: PrefilledContext, plan: CameraPlan,
                 fractions: tuple[float, ...] = CALIBRATION_FRACTIONS) -> None:
        g = backbone.geometry
        self.backbone, self.plan, self.frame = backbone, plan, full.context_frames
        n_full = full.cache.banks[0][0].n
        self.caches: dict[int, KVCache] = {}
        for frac in fractions:
            n = round(frac * n_full)
            if n == 0:
                cache = KVCache.from_geometry(g)
            else:
                cache = full.cache.fork()
                newest = n

                def keep_newest(bank, newest=newest):
                    return torch.arange(bank.n) >= bank.n - newest

                cache.compact(keep_newest)
            cache.begin_chunk(full.next_chunk, full.context_frames, g.chunk_frames)
            self.caches[n] = cache
        shape = (full.batch, g.latent_channels, g.chunk_frames, g.latent_height, g.latent_width)
        self.x = torch.randn(shape, generator=seeded_generator("bench-calibrate"))
        self.times: dict[int, list[float]] = {n: [] for n in self.caches}
        self.measure(record=False)  # warm-up

    def measure(self, calls: int = 3, record: bool = True) -> None:
        with torch.no_grad():
            for n, cache in self.caches.items():
                for _ in range(calls):
                    start = time.perf_counter()
                    self.backbone.denoise(self.x, 0.5, cache, self.frame, self.plan)
                    if record:
                        self.times[n].append(time.perf_counter() - start)

    def model(self) -> CostModel:
        return CostModel(tuple((n, statistics.median(ts)) for n, ts in sorted(self.times.items())))


def transfer_seconds(moved_bytes: float) -> float:
    """Modelled seconds to move ``moved_bytes`` between host and device at :data:`PCIE_BYTES_PER_S`."""
    return moved_bytes / PCIE_BYTES_PER_S


# ----------------------------------------------------------------------------------- one length
@dataclass
class Runs:
    """Timed continuations of one method at one thread count."""

    seconds: list[float] = field(default_factory=list)
    decide_seconds: list[float] = field(default_factory=list)
    peak_rss: list[float] = field(default_factory=list)
    rss_delta: list[float] = field(default_factory=list)


@dataclass
class Entry:
    """Everything measured for one method at one context length."""

    prefilled: PrefilledContext
    prefill_seconds: float
    calls: list[int] = field(default_factory=list)
    pr: float = math.nan
    target_pr: float | None = None
    peak_kv_bytes: int = 0
    allocated_kv_bytes: int = 0
    generated_chunks: int = 0
    has_store: bool = False
    peak_store_bytes: int = 0
    moved_bytes_per_chunk: float = 0.0
    survivors: dict[int, BankIds] | None = None
    before: dict[int, BankIds] | None = None
    runs: dict[int, Runs] = field(default_factory=dict)


def account(backbone, entry: Entry, plan: CameraPlan, n_frames: int, seed: int, record: bool) -> None:
    """The untimed accounting continuation (also the warm-up): calls, PR, peak stored bytes and, with
    ``record``, the ids kept after every generated chunk."""
    recorder = CallRecorder(backbone)
    kept = KeptIds() if record else None
    cont = continue_task(recorder, entry.prefilled, plan, n_frames, seed, on_chunk_end=kept,
                         on_before_clean=kept.before_clean if kept is not None else None)
    entry.survivors = kept.survivors if kept is not None else None
    entry.before = kept.before if kept is not None else None
    entry.calls = recorder.calls
    entry.pr = cont.ledger.pruning_ratio()
    entry.target_pr = getattr(entry.prefilled.method, "quota_pr", None)
    entry.peak_kv_bytes = cont.ledger.peak_stored_bytes
    entry.allocated_kv_bytes = cont.cache.allocated_bytes()
    entry.generated_chunks = len(cont.ledger.entries)
    entry.has_store = cont.cache.store is not None
    entry.peak_store_bytes = cont.ledger.peak_store_bytes
    entry.moved_bytes_per_chunk = cont.ledger.moved_bytes_per_chunk()


def timed_round(backbone, entries: dict[str, Entry], probe: CostProbe, threads: int, plan: CameraPlan,
                n_frames: int, seed: int, rng: np.random.Generator) -> None:
    """One continuation per method and one cost-model measurement at ``threads`` torch threads, in a
    shuffled order."""
    torch.set_num_threads(threads)
    order: list[str | None] = [*entries, None]
    for i in rng.permutation(len(order)):
        label = order[i]
        if label is None:
            probe.measure()
            continue
        entry = entries[label]
        runs = entry.runs.setdefault(threads, Runs())
        gc.collect()
        before = rss_mb()
        reset_peak_rss()
        cont = continue_task(backbone, entry.prefilled, plan, n_frames, seed)
        peak = peak_rss_mb()
        runs.seconds.append(cont.seconds)
        runs.decide_seconds.append(cont.decide_seconds)
        runs.peak_rss.append(peak)
        runs.rss_delta.append(peak - before)
        del cont


def bench_length(backbone, frames: int, *, methods: list[str], continuation: int, seed: int,
                 thread_counts: list[int], repeats: int, oracle: bool, oracle_pair_count: int,
                 rng: np.random.Generator, machine: dict[str, Any]) -> list[dict]:
    """Prefill, account, calibrate and time every method at one context length.

    ``methods`` are labels of :data:`METHODS`; every count of ``thread_counts`` (torch intra-op
    threads) is timed in the same rounds; ``oracle`` adds the replay of DeCoPrune's keep pattern,
    ``oracle_pair_count`` back-to-back DeCoPrune / oracle pairs. Prints progress; returns CSV rows.
    """
    g = backbone.geometry
    latents, plan = make_context(backbone, frames, continuation, seed)
    print(f"\n== context {frames} latent frames ({frames * g.tokens_per_frame} history tokens per head under "
          f"FullKV) ==", flush=True)
    torch.set_num_threads(thread_counts[0])
    entries: dict[str, Entry] = {}
    for label in methods:
        method = METHODS[label].build()
        start = time.perf_counter()
        pre = prefill(backbone, method, latents, plan, seed)
        entries[label] = Entry(pre, time.perf_counter() - start)
        print(f"  prefill {label:<24s} {entries[label].prefill_seconds:7.2f} s", flush=True)
    for label, entry in entries.items():
        account(backbone, entry, plan, continuation, seed, record=label == DECOPRUNE)
    if DECOPRUNE in entries and oracle:
        deco = entries[DECOPRUNE]
        assert deco.survivors is not None and deco.before is not None  # recorded by its accounting run
        replay = OracleMask(survivors=deco.survivors, initial_layout=deco.prefilled.method.layout(g),
                            before=deco.before)
        entries[ORACLE] = Entry(dataclasses.replace(deco.prefilled, method=replay), 0.0)
        account(backbone, entries[ORACLE], plan, continuation, seed, record=False)
        if entries[ORACLE].calls != deco.calls:
            raise RuntimeError("the oracle replay does not see what DeCoPrune saw")
    probes = {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        probes[threads] = CostProbe(backbone, entries[REFERENCE].prefilled, plan)
    for r in range(repeats):
        for threads in (int(t) for t in rng.permutation(thread_counts)):
            timed_round(backbone, entries, probes[threads], threads, plan, continuation, seed, rng)
            print(f"  round {r + 1}/{repeats}, {threads} thread(s): " + ", ".join(
                f"{label} {e.runs[threads].seconds[-1]:.2f}" for label, e in entries.items()), flush=True)
    pairs: dict[int, list[float]] = {}
    if ORACLE in entries and oracle_pair_count:
        threads = thread_counts[0]
        torch.set_num_threads(threads)
        pairs[threads] = oracle_pairs(backbone, entries[DECOPRUNE], entries[ORACLE], oracle_pair_count, plan,
                                      continuation, seed)
        print(f"  {DECOPRUNE} / oracle, {len(pairs[threads])} back-to-back pairs: median ratio "
              f"{statistics.median(pairs[threads]):.4f}", flush=True)
    rows = []
    for threads in thread_counts:
        cost = probes[threads].model()
        print(f"  cost model, {threads} thread(s): T(n) per call, n = history keys per head: "
              + ", ".join(f"T({n}) = {sec * 1e3:.1f} ms" for n, sec in cost.points), flush=True)
        rows += summarise(frames, threads, entries, cost, g, machine, pairs.get(threads))
    return rows


def oracle_pairs(backbone, deco: Entry, oracle: Entry, pairs: int, plan: CameraPlan, n_frames: int,
                 seed: int) -> list[float]:
    """DeCoPrune / oracle time ratios of back-to-back continuations (which goes first alternates).

    Paired and adjacent in time, so machine load largely cancels: a sharper measure of the online
    scoring's cost than the ratio of round medians.
    """
    ratios = []
    for i in range(pairs):
        order = (deco, oracle) if i % 2 == 0 else (oracle, deco)
        seconds = {id(e): continue_task(backbone, e.prefilled, plan, n_frames, seed).seconds for e in order}
        ratios.append(seconds[id(deco)] / seconds[id(oracle)])
    return ratios


def summarise(frames: int, threads: int, entries: dict[str, Entry], cost: CostModel, geometry,
              machine: dict[str, Any], pair_ratios: list[float] | None = None) -> list[dict]:
    """One CSV row per method: medians of the timed runs at ``threads`` and the accounting figures
    (``pair_ratios``: DeCoPrune / oracle back-to-back ratios, written on DeCoPrune's row)."""
    heads = geometry.num_layers * geometry.num_heads
    ref = entries[REFERENCE]
    ref_runs = ref.runs[threads]
    ref_med = statistics.median(ref_runs.seconds)
    ref_pred = cost.continuation(ref.calls, heads)
    rows = []
    for label, e in entries.items():
        runs = e.runs[threads]
        med = statistics.median(runs.seconds)
        pred = cost.continuation(e.calls, heads)
        rows.append({
            "context_frames": frames,
            "threads": threads,
            "method": label,
            "target_pr": "" if e.target_pr is None else e.target_pr,
            "realised_pr": round(e.pr, 6),
            "continuation_s_median": round(med, 4),
            "continuation_s_min": round(min(runs.seconds), 4),
            "continuation_s_max": round(max(runs.seconds), 4),
            "repeats": len(runs.seconds),
            "speedup_vs_fullkv": round(ref_med / med, 3),
            "speedup_paired_median": round(statistics.median(f / x for f, x in zip(ref_runs.seconds, runs.seconds)), 3),
            "ideal_speedup": round(ref_pred / pred, 3),
            "fraction_of_bound": round((ref_med / med) / (ref_pred / pred), 3),
            "predicted_s": round(pred, 4),
            "model_calls": len(e.calls),
            "generated_chunks": e.generated_chunks,
            "mean_visible_keys_per_head": round(sum(e.calls) / max(1, len(e.calls)) / heads, 1),
            "attention_gflop": round(attention_flops(e.calls, geometry, e.prefilled.batch) / 1e9, 3),
            "peak_kv_mb": round(e.peak_kv_bytes / 2**20, 3),
            "peak_kv_vs_fullkv": round(e.peak_kv_bytes / ref.peak_kv_bytes, 4),
            "allocated_kv_mb": round(e.allocated_kv_bytes / 2**20, 3),
            "peak_store_mb": round(e.peak_store_bytes / 2**20, 3) if e.has_store else "",
            "moved_mb_per_chunk": round(e.moved_bytes_per_chunk / 2**20, 4) if e.has_store else "",
            "transfer_ms_per_chunk_model": (round(1e3 * transfer_seconds(e.moved_bytes_per_chunk), 4)
                                            if e.has_store else ""),
            "peak_rss_mb": round(statistics.median(runs.peak_rss), 1),
            "rss_delta_mb": round(statistics.median(runs.rss_delta), 1),
            "decide_s_median": round(statistics.median(runs.decide_seconds), 5),
            "prefill_s": round(e.prefill_seconds, 3),
            "cost_a_ms": round(cost.a * 1e3, 3),
            "cost_us_per_key_at_full": round(cost.per_key_at_full * 1e6, 4),
            "fullkv_predicted_over_measured": round(ref_pred / ref_med, 3),
            "oracle_overhead_paired": (round(statistics.median(pair_ratios) - 1.0, 4)
                                       if label == DECOPRUNE and pair_ratios else ""),
            **machine,
        })
    return rows


# ----------------------------------------------------------------------------------- reporting
COLUMNS = (  # (row key, title, width, format, scale)
    ("method", "method", 22, "s", 1),
    ("realised_pr", "PR", 6, ".3f", 1),
    ("model_calls", "calls", 5, "d", 1),
    ("continuation_s_median", "cont s", 7, ".3f", 1),
    ("speedup_vs_fullkv", "speed-up", 8, ".2f", 1),
    ("ideal_speedup", "ideal", 6, ".2f", 1),
    ("fraction_of_bound", "of bound", 8, ".2f", 1),
    ("attention_gflop", "attn GFLOP", 10, ".1f", 1),
    ("peak_kv_mb", "peak KV MB", 10, ".2f", 1),
    ("peak_rss_mb", "peak RSS MB", 11, ".0f", 1),
    ("rss_delta_mb", "RSS +MB", 7, ".0f", 1),
    ("decide_s_median", "decide ms", 9, ".1f", 1e3),
)


def format_table(rows: list[dict]) -> str:
    """The per-length tables (one per thread count), fixed-width text."""
    header = " ".join(f"{title:<{w}s}" if key == "method" else f"{title:>{w}s}" for key, title, w, _, _ in COLUMNS)
    out = []
    for threads, frames in sorted({(r["threads"], r["context_frames"]) for r in rows}):
        out += [f"\ncontext {frames} latent frames, {threads} thread(s)", header]
        for r in (r for r in rows if (r["threads"], r["context_frames"]) == (threads, frames)):
            out.append(" ".join(f"{r[key]:<{w}s}" if key == "method" else f"{r[key] * scale:>{w}{fmt}}"
                                for key, _, w, fmt, scale in COLUMNS))
    return "\n".join(out)


def markdown_table(rows: list[dict]) -> str:
    """The rows as a Markdown table (for docs/speed.md and the README), one line per length and method."""
    out = [
        "| context frames | threads | method | PR | continuation s | speed-up | cost-model bound | of bound | "
        "attention GFLOP | peak stored KV MB (x FullKV) | RSS +MB |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["threads"], r["context_frames"])):
        out.append(
            f"| {r['context_frames']} | {r['threads']} | {r['method']} | {r['realised_pr']:.3f} | "
            f"{r['continuation_s_median']:.3f} | {r['speedup_vs_fullkv']:.2f}x | {r['ideal_speedup']:.2f}x | "
            f"{r['fraction_of_bound']:.2f} | {r['attention_gflop']:.1f} | {r['peak_kv_mb']:.1f} "
            f"({r['peak_kv_vs_fullkv']:.3f}) | {r['rss_delta_mb']:.0f} |"
        )
    return "\n".join(out)


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """Rows written by :func:`write_csv`, numbers parsed back."""

    def parse(value: str) -> Any:
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return value

    with path.open(newline="") as fh:
        return [{k: parse(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def plot(rows: list[dict], path: Path) -> None:
    """Speed-up vs context length per method (solid) and its cost-model bound (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thread_counts = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(1, len(thread_counts), figsize=(7.5 * len(thread_counts), 4.8), squeeze=False)
    colours = plt.get_cmap("tab10")
    markers = "osD^v<>ph*"
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != REFERENCE]
    frames = sorted({r["context_frames"] for r in rows})
    for ax, threads in zip(axes[0], thread_counts):
        for i, m in enumerate(methods):
            pts = sorted((r["context_frames"], r["speedup_vs_fullkv"], r["ideal_speedup"])
                         for r in rows if r["method"] == m and r["threads"] == threads)
            x = [p[0] for p in pts]
            ax.plot(x, [p[1] for p in pts], "-", marker=markers[i % len(markers)], color=colours(i % 10), label=m)
            ax.plot(x, [p[2] for p in pts], "--", color=colours(i % 10), linewidth=0.8, alpha=0.7)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(frames, [str(f) for f in frames])
        ax.set_xlabel("context length (latent frames)")
        ax.set_ylabel("continuation speed-up vs FullKV")
        ax.set_title(f"tiny backbone, {rows[0]['cpu']}, {threads} thread(s)\n"
                     "solid: measured, dashed: cost-model bound", fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_targets(rows: list[dict], threads: int) -> list[str]:
    """The speed and memory targets (docs/speed.md) at the longest context and ``threads``, one line each."""
    longest = max(r["context_frames"] for r in rows)
    at = {r["method"]: r for r in rows if r["context_frames"] == longest and r["threads"] == threads}
    lines = []

    def line(ok: bool, text: str) -> None:
        lines.append(f"[{'met' if ok else 'NOT MET'}] {text}")

    where = f"{longest} frames, {threads} thread(s)"
    if DECOPRUNE in at:
        d = at[DECOPRUNE]
        line(round(d["realised_pr"], 4) >= 0.85 and d["speedup_vs_fullkv"] >= 4.0,
             f"{DECOPRUNE} at {where}: PR {d['realised_pr']:.4f} >= 0.85 (exactly {d['realised_pr']:.6f}: the "
             f"per-head budget is rounded to whole tokens) and speed-up {d['speedup_vs_fullkv']:.2f}x >= 4x")
        line(d["fraction_of_bound"] >= 0.8,
             f"{DECOPRUNE}: {d['fraction_of_bound']:.2f} of its cost-model bound ({d['ideal_speedup']:.2f}x) >= 0.8")
        line(d["peak_kv_vs_fullkv"] <= 0.2,
             f"{DECOPRUNE}: peak stored KV {d['peak_kv_mb']:.1f} MB = {d['peak_kv_vs_fullkv']:.3f} of FullKV's <= 1/5")
        if ORACLE in at:
            o = at[ORACLE]
            rounds = d["continuation_s_median"] / o["continuation_s_median"] - 1.0
            paired = d["oracle_overhead_paired"]
            overhead = paired if paired != "" else rounds
            decide = (d["decide_s_median"] - o["decide_s_median"]) / o["continuation_s_median"]
            line(overhead < 0.05,
                 f"{DECOPRUNE}: online scoring adds {100 * overhead:+.1f}% to continuation time vs the same keep "
                 f"pattern as an oracle mask ({'median of back-to-back pairs; ' if paired != '' else ''}round "
                 f"medians {d['continuation_s_median']:.3f} vs {o['continuation_s_median']:.3f} s = "
                 f"{100 * rounds:+.1f}%; decide + compact {1e3 * d['decide_s_median']:.1f} vs "
                 f"{1e3 * o['decide_s_median']:.1f} ms = {100 * decide:+.2f}% of the continuation) < 5%")
    if STREAMING in at:
        s = at[STREAMING]
        line(s["fraction_of_bound"] >= 0.8,
             f"{STREAMING}: {s['fraction_of_bound']:.2f} of its cost-model bound ({s['ideal_speedup']:.2f}x) >= 0.8")
    return lines


def transfer_lines(rows: list[dict]) -> list[str]:
    """One line per row of a method with a host store: the bytes it moved host <-> device per generated
    chunk (counted), their modelled transfer time, and the measured continuation time per chunk."""
    lines = []
    for r in rows:
        if r["moved_mb_per_chunk"] == "":
            continue
        per_chunk = r["continuation_s_median"] / r["generated_chunks"]
        ms = r["transfer_ms_per_chunk_model"]
        lines.append(
            f"{r['method']} at {r['context_frames']} frames, {r['threads']} thread(s): moved "
            f"{r['moved_mb_per_chunk']:.3f} MB host <-> device per generated chunk (counted; store peak "
            f"{r['peak_store_mb']:.1f} MB); modelled transfer {ms:.3f} ms per chunk at "
            f"{PCIE_BYTES_PER_S / 1e9:.0f} GB/s (PCIe 4.0 x16, effective) = {ms / 1e3 / per_chunk:.2%} of its "
            f"measured {per_chunk:.3f} s per chunk on this CPU, where the copy is in memory and inside that time")
    return lines


def machine_info(weights: str) -> dict[str, Any]:
    """CPU, torch version, weights and git commit (written into every CSV row)."""
    return {"cpu": f"{cpu_name()} ({os.cpu_count()} cores)", "torch": torch.__version__, "weights": weights,
            "git": git_commit()[:12]}

