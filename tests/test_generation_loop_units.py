"""The AR loop by hand, on a scripted backbone: which model calls each chunk gets (probes, denoising steps,
the ``t = 0`` pass) in which order with which inputs and noise levels, what every method hook and caller hook
sees, where each chunk sits on the timeline, the seeds of every noise draw, what prefill and continuation
return (ledger rows, kept tokens, timings), the attention recorded on request, and every refusal's words.

The backbone predicts ``x0 = frame index + 10 * t + (history tokens layer 0 sees)`` for every token, so
each prediction is known by hand: the geometry (:func:`fakes.fake_geometry`) has 4 tokens per frame and
chunks of 2 frames (8 tokens), and nothing is pruned unless a test says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from cmbench.cache import ChunkInfo, HostStore, KVCache, PRLedger
from cmbench.cache.ledger import LedgerEntry
from cmbench.errors import ConfigError
from cmbench.generation import loop
from cmbench.generation.loop import Continuation, GenerationSettings, camera_poses, check_settings, continue_task, prefill
from cmbench.generation.sampler import FlowMatchSampler, renoise
from cmbench.hashing import seeded_generator
from cmbench.methods.base import Method, Needs
from fakes import ScriptedBackbone, fake_geometry

G = fake_geometry()  # 4 tokens per frame, 2 frames (8 tokens) per chunk, latents [B, 3, F, 4, 4]
SAMPLER = FlowMatchSampler((900.0, 500.0, 100.0))  # levels 0.9, 0.5, 0.1
SETTINGS = GenerationSettings(sampler=SAMPLER)
DTYPE = torch.float64  # the context's dtype: generated noise must follow it


def frames_valued(frames: int, offset: float = 0.0) -> torch.Tensor:
    """Latents ``[1, 3, frames, 4, 4]`` whose every value in frame ``f`` is ``f + offset`` (float64)."""
    return (torch.arange(frames, dtype=DTYPE) + offset).view(1, 1, frames, 1, 1).expand(1, 3, frames, 4, 4).clone()


def at_frames(start: int, frames: int, plus: float) -> torch.Tensor:
    """Latents ``[1, 3, frames, 4, 4]`` of absolute frames ``start ..``, frame ``f`` holding ``f + plus``."""
    return frames_valued(start + frames, plus)[:, :, start:]


class ZeroQueries:
    """A cache view whose ``attend`` gets all-zero queries: the softmax is uniform over every key it sees."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache

    def attend(self, layer, q, k, v):
        return self.cache.attend(layer, torch.zeros_like(q), k, v)


class SpyBackbone(ScriptedBackbone):
    """:class:`fakes.ScriptedBackbone` over ``world`` = frame index and discrepancy 10, plus the history layer 0
    sees, logging every call into ``events`` as ``("model", open chunk, frame_start, t, probing, seen)``.

    Parameters
    ----------
    events : list
        Shared with the method and the caller's hooks, so the order of everything is one list.
    poses : Tensor, optional
        What :meth:`camera_poses` returns for the condition ``"COND"`` (``None`` for any other).
    zero_queries_at : float, optional
        Noise level whose calls attend with all-zero queries (uniform attention over the visible keys).
    """

    def __init__(self, events: list, poses: torch.Tensor | None = None, zero_queries_at: float | None = None,
                 clock: list | None = None) -> None:
        super().__init__(G, frames_valued(12), torch.full((1, 3, 12, 4, 4), 10.0, dtype=DTYPE))
        self.events, self.poses, self.zero_queries_at, self.clock = events, poses, zero_queries_at, clock
        self.inputs: list[torch.Tensor] = []
        self.conds: list = []

    def camera_poses(self, cond):
        return self.poses if cond == "COND" else None

    def denoise(self, x_t, t, cache, frame_start, cond=None):
        seen = len(cache.visible_history(cache.banks[0][0]))
        self.events.append(("model", cache.current.index, frame_start, float(t), cache.probing, seen))
        self.inputs.append(x_t.clone())
        self.conds.append(cond)
        if self.clock is not None:
            self.clock[0] += 8.0
        view = ZeroQueries(cache) if t == self.zero_queries_at else cache
        return super().denoise(x_t, t, view, frame_start, cond) + seen


@dataclass
class Spy(Method):
    """A keep-everything method that logs its hooks into ``events`` and keeps every signal it is given.

    With ``clock``, its hooks advance that fake clock: ``before_denoise`` by 1, ``before_clean`` by 2 and
    ``after_chunk`` by 4 (so a chunk's decisions take 7 "seconds").
    """

    name = "spy"

    want: Needs = field(default_factory=Needs)
    events: list = field(default_factory=list)
    clock: list | None = None
    store: HostStore | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.signals: list = []
        self.befores: list = []

    def needs(self) -> Needs:
        return self.want

    def _tick(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock[0] += seconds

    def host_store(self):
        return self.store

    def attention_key_frames(self, geometry, chunk):
        return (0, chunk.frame_start + geometry.chunk_frames - 1)  # the first frame and the chunk's last

    def probe_hide(self, cache):
        self.events.append(("probe_hide", cache.current.index))
        return lambda bank: bank.field("chunk") == 0

    def before_denoise(self, cache, sig):
        self.events.append(("before_denoise", cache.current.index, sig.phase))
        self.befores.append(sig)
        self._tick(1.0)

    def before_clean(self, cache, chunk):
        self.events.append(("before_clean", cache.current.index, chunk.index))
        self._tick(2.0)

    def after_chunk(self, cache, sig):
        self.events.append(("after_chunk", sig.chunk.index, sig.phase, sig.generated_index, cache.committed_tokens))
        self.signals.append(sig)
        self._tick(4.0)
        super().after_chunk(cache, sig)


@dataclass
class OtherSpy(Spy):
    """Another class with Spy's bank layout (a continuation must use the prefill method's class)."""

    name = "other"


def hooks(events: list) -> dict:
    """The three caller hooks of :func:`prefill` / :func:`continue_task`, logging into ``events``."""
    return {
        "on_chunk_end": lambda cache, sig: events.append(("on_chunk_end", sig.chunk.index, cache.committed_tokens)),
        "on_before_clean": lambda cache, info: events.append(("on_before_clean", cache.current.index, info.index)),
        "on_before_denoise": lambda cache, info: events.append(("on_before_denoise", cache.current.index,
                                                                info.index)),
    }


def noise(seed: int, stream: str, chunk: int, shape=(1, 3, 2, 4, 4)) -> torch.Tensor:
    """The loop's documented noise draw ``(seed, stream, chunk)`` (float32, then the context's dtype)."""
    return torch.randn(shape, generator=seeded_generator(seed, stream, chunk)).to(DTYPE)


# --- prefill -----------------------------------------------------------------------------------------------


def probing_prefill(want: Needs, **kw):
    """Prefill 6 context frames (3 chunks) of value = frame index, seed 3, condition ``"COND"``, with hooks."""
    events: list = []
    backbone = SpyBackbone(events, poses=torch.eye(4, dtype=torch.float64).expand(12, 4, 4))
    spy = Spy(want=want, events=events)
    pre = prefill(backbone, spy, frames_valued(6), "COND", 3, kw.pop("settings", SETTINGS), **hooks(events), **kw)
    return pre, spy, backbone, events


def test_each_context_chunk_gets_its_probes_then_the_clean_pass_with_every_hook_in_order():
    """Context chunk ``c`` (frames ``2c, 2c+1``) sees ``8c`` history tokens: the re-noise probe at the probe
    step's level 0.5 (x0 = frame + 5 + 8c), the no-context probe (x0 = frame + 5), then the t = 0 pass."""
    pre, spy, backbone, events = probing_prefill(Needs(probe_step=1, no_context_probe=True))
    want = []
    for c in range(3):
        fs, seen = 2 * c, 8 * c
        want += [("before_denoise", c, "context"), ("on_before_denoise", c, c),
                 ("model", c, fs, 0.5, True, seen), ("model", c, fs, 0.5, True, 0),
                 ("before_clean", c, c), ("on_before_clean", c, c), ("model", c, fs, 0.0, False, seen),
                 ("after_chunk", c, "context", None, seen + 8), ("on_chunk_end", c, seen + 8)]
    assert events == want
    assert backbone.conds == ["COND"] * 9
    context = frames_valued(6)
    for c, sig in enumerate(spy.signals):
        sl = slice(2 * c, 2 * c + 2)
        assert sig.chunk == ChunkInfo(c, 2 * c, 2, 8 * c, 8) and sig.geometry is G
        assert sig.context_frames == 6 and sig.seed == 3 and sig.attention is None
        assert torch.equal(sig.x0_final, context[:, :, sl])
        assert torch.equal(sig.x0_probe, at_frames(2 * c, 2, 5 + 8 * c))
        assert torch.equal(sig.x0_no_context, at_frames(2 * c, 2, 5))
        assert (sig.previous_final is None) if c == 0 else torch.equal(sig.previous_final, context[:, :, 2 * c - 2:2 * c])
        # the probe's input: the observed chunk re-noised to 0.5 with noise (seed, "context-probe", c)
        probe_in, no_context_in, clean_in = backbone.inputs[3 * c: 3 * c + 3]
        want_in = renoise(context[:, :, sl], noise(3, "context-probe", c), 0.5)
        assert torch.equal(probe_in, want_in) and torch.equal(no_context_in, want_in)
        assert torch.equal(clean_in, context[:, :, sl])
    for c, before in enumerate(spy.befores):
        assert before.chunk == ChunkInfo(c, 2 * c, 2, 8 * c, 8) and before.geometry is G
        assert before.phase == "context" and before.poses is None and before.queries is None


def test_prefill_returns_the_context_where_the_continuation_starts():
    pre, spy, backbone, _ = probing_prefill(Needs(probe_step=0))
    assert pre.method is spy and pre.settings is SETTINGS and pre.seed == 3
    assert pre.context_frames == 6 and pre.next_chunk == 3 and pre.batch == 1  # 6 frames // 2 per chunk
    assert torch.equal(pre.last_chunk, frames_valued(6)[:, :, 4:6])
    assert pre.like.shape == () and pre.like.dtype == DTYPE and pre.like.item() == 0
    assert pre.ledger.phase == "context"
    assert [(e.chunk, e.frame_start, e.full) for e in pre.ledger.entries] == [(0, 0, 0), (1, 2, 8), (2, 4, 16)]
    assert pre.kept_tokens == {0: 8, 1: 8, 2: 8}
    assert pre.cache.committed_tokens == 24 and pre.cache.current is None
    assert pre.cache.reindexed == (6, 8, 17.0)  # the defaults: N_r = 8, L_virt = 17
    # probe step 0 probes at level 0.9: x0 = frame + 9 + history; its input is re-noised in the context's dtype
    assert torch.equal(spy.signals[2].x0_probe, at_frames(4, 2, 9 + 16))
    assert torch.equal(backbone.inputs[0], renoise(frames_valued(6)[:, :, :2], noise(3, "context-probe", 0), 0.9))
    assert spy.signals[2].x0_no_context is None


def test_the_settings_defaults():
    s = GenerationSettings()
    assert s.sampler == FlowMatchSampler() and s.reindex is True and s.compute_attention is True
    assert s.reindex_recent == 8 and s.reindex_virtual_length == 17.0


@pytest.mark.parametrize("settings, frames, want", [
    (GenerationSettings(sampler=SAMPLER, reindex_recent=2, reindex_virtual_length=3.0), 6, (6, 2, 3.0)),
    (GenerationSettings(sampler=SAMPLER, reindex=False), 6, None),
    (SETTINGS, 0, None),  # no context: nothing to re-index
])
def test_the_reindex_runs_with_the_settings_only_after_a_context(settings, frames, want):
    pre = prefill(SpyBackbone([]), Spy(), frames_valued(frames), "COND", 0, settings)
    assert pre.cache.reindexed == want
    assert pre.next_chunk == frames // 2 and pre.kept_tokens == {c: 8 for c in range(frames // 2)}


def test_prefill_without_settings_uses_the_default_sampler():
    """No settings: the default four timesteps reach the generation (four denoising calls, then t = 0)."""
    events: list = []
    pre = prefill(SpyBackbone(events), Spy(events=events), frames_valued(2), "COND", 0)
    assert pre.settings == GenerationSettings() and pre.cache.reindexed == (2, 8, 17.0)
    continue_task(SpyBackbone(events), pre, "COND", 2, 0)
    ts = [e[3] for e in events if e[0] == "model"]
    assert ts == [0.0, 0.999, 0.957, 0.899, 0.702, 0.0]


def test_a_post_prune_probe_hides_what_the_method_will_drop_and_reruns_on_generated_chunks():
    """With ``post_prune_probe`` the probe hides chunk 0 (Spy's ``probe_hide``): the context probe of chunk 2
    sees 16 - 8 tokens, and a generated chunk's probe step is predicted again with chunk 0 hidden."""
    pre, spy, backbone, events = probing_prefill(Needs(probe_step=1, post_prune_probe=True))
    assert [e for e in events if e[0] == "model" and e[4]] == [
        ("model", 0, 0, 0.5, True, 0), ("model", 1, 2, 0.5, True, 0), ("model", 2, 4, 0.5, True, 8)]
    assert [e for e in events if e[0] == "probe_hide"] == [("probe_hide", 0), ("probe_hide", 1), ("probe_hide", 2)]
    assert torch.equal(spy.signals[2].x0_probe, at_frames(4, 2, 5 + 8))
    del events[:]
    continue_task(backbone, pre, "COND", 2, 5)
    # generated chunk 3 (frames 6, 7) sees 24 tokens; its probe at step 1 sees 24 - 8 = 16
    assert [e for e in events if e[0] in ("model", "probe_hide")] == [
        ("model", 3, 6, 0.9, False, 24), ("model", 3, 6, 0.5, False, 24), ("probe_hide", 3),
        ("model", 3, 6, 0.5, True, 16), ("model", 3, 6, 0.1, False, 24), ("model", 3, 6, 0.0, False, 24)]
    assert torch.equal(spy.signals[-1].x0_probe, at_frames(6, 2, 5 + 16))
    assert spy.signals[-1].x0_no_context is None


def test_without_probes_the_trajectory_alone_runs_and_no_probe_is_hidden():
    pre, spy, backbone, events = probing_prefill(Needs())
    assert [e[3:5] for e in events if e[0] == "model"] == [(0.0, False)] * 3
    del events[:]
    continue_task(backbone, pre, "COND", 2, 5)
    assert [e for e in events if e[0] == "model"] == [
        ("model", 3, 6, t, False, 24) for t in (0.9, 0.5, 0.1, 0.0)]
    assert all(s.x0_probe is None and s.x0_no_context is None for s in spy.signals)


def test_a_query_probe_runs_the_first_call_in_a_probe_and_hands_each_layers_mean_query_before_denoising():
    pre, spy, backbone, events = probing_prefill(Needs(query_probe=True))
    assert events[:3] == [("model", 0, 0, 0.0, True, 0), ("before_denoise", 0, "context"),
                          ("on_before_denoise", 0, 0)]
    del events[:], backbone.inputs[:]
    continue_task(backbone, pre, "COND", 2, 5, **hooks(events))
    assert events[:3] == [("model", 3, 6, 0.9, True, 24), ("before_denoise", 3, "generation"),
                          ("on_before_denoise", 3, 3)]
    # the generated chunk's query probe runs on the chunk's starting noise
    assert torch.equal(backbone.inputs[0], noise(5, "noise", 3))
    for before in spy.befores:
        assert sorted(before.queries) == [0, 1]
        assert all(q.shape == (1, 2, 12) for q in before.queries.values())
        assert sorted(before.probe_queries) == [0, 1]
        assert all(q.dim() == 4 and q.shape[1] > 1 and torch.equal(q.mean(dim=1), before.queries[layer])
                   for layer, q in before.probe_queries.items())
    # ScriptedBackbone's queries are the chunk's token values tiled: context chunk 0 holds 0 and 1 -> mean 0.5
    assert torch.equal(spy.befores[0].queries[0], torch.full((1, 2, 12), 0.5, dtype=DTYPE))


# --- continuation ------------------------------------------------------------------------------------------


def test_each_generated_chunk_is_sampled_from_its_seeded_noise_then_written_clean():
    """Generated chunk ``3 + j`` (frames ``6 + 2j``) sees ``24 + 8j`` tokens: steps at 0.9, 0.5, 0.1 (the
    no-context probe at the probe step 1), then the t = 0 pass of the final x0 = frame + 1 + history."""
    pre, spy, backbone, events = probing_prefill(Needs(probe_step=1, no_context_probe=True))
    del events[:], backbone.inputs[:], backbone.conds[:]
    spy.signals.clear()
    spy.befores.clear()
    cont = continue_task(backbone, pre, "COND", 4, 7, **hooks(events))
    want = []
    for j in range(2):
        c, fs, seen = 3 + j, 6 + 2 * j, 24 + 8 * j
        want += [("before_denoise", c, "generation"), ("on_before_denoise", c, c),
                 ("model", c, fs, 0.9, False, seen), ("model", c, fs, 0.5, False, seen),
                 ("model", c, fs, 0.5, True, 0), ("model", c, fs, 0.1, False, seen),
                 ("before_clean", c, c), ("on_before_clean", c, c), ("model", c, fs, 0.0, False, seen),
                 ("after_chunk", c, "generation", j, seen + 8), ("on_chunk_end", c, seen + 8)]
    assert events == want and backbone.conds == ["COND"] * 10
    finals = [at_frames(6 + 2 * j, 2, 1 + 24 + 8 * j) for j in range(2)]
    assert torch.equal(cont.latents, torch.cat(finals, dim=2)) and cont.latents.dtype == DTYPE
    for j, sig in enumerate(spy.signals):
        c, fs, seen = 3 + j, 6 + 2 * j, 24 + 8 * j
        assert sig.chunk == ChunkInfo(c, fs, 2, 4 * fs, 8) and sig.geometry is G and sig.phase == "generation"
        assert sig.generated_index == j and sig.context_frames == 6 and sig.seed == 7 and sig.attention is None
        assert torch.equal(sig.x0_final, finals[j])
        assert torch.equal(sig.x0_probe, at_frames(fs, 2, 5 + seen))  # the trajectory's own
        assert torch.equal(sig.x0_no_context, at_frames(fs, 2, 5))
        previous = pre.last_chunk if j == 0 else finals[0]
        assert torch.equal(sig.previous_final, previous)
        start, step1, no_context, step2, clean = backbone.inputs[5 * j: 5 * j + 5]
        x0 = at_frames(fs, 2, 9 + seen)
        assert torch.equal(start, noise(7, "noise", c)) and start.dtype == DTYPE
        # the deterministic step: eps = (x - (1 - 0.9) x0) / 0.9, then x' = (1 - 0.5) x0 + 0.5 eps
        torch.testing.assert_close(step1, renoise(x0, (start - 0.1 * x0) / 0.9, 0.5))
        assert torch.equal(no_context, step1) and torch.equal(clean, finals[j])
    for j, before in enumerate(spy.befores):
        assert before.chunk.index == 3 + j and before.phase == "generation" and before.queries is None
        assert before.poses is None and before.geometry is G


def test_the_continuation_records_its_own_ledger_on_a_fork():
    pre, _, backbone, _ = probing_prefill(Needs())
    cont = continue_task(backbone, pre, "COND", 4, 7)
    assert cont.ledger.phase == "generation"
    assert [(e.chunk, e.frame_start, e.full) for e in cont.ledger.entries] == [(3, 6, 24), (4, 8, 32)]
    assert cont.kept_tokens == {c: 8 for c in range(5)}
    assert cont.cache is not pre.cache and cont.cache.committed_tokens == 40 and pre.cache.committed_tokens == 24
    per_token = 2 * 2 * 2 * 12 * 8  # K and V, 2 layers, 2 heads, head_dim 12, float64
    assert cont.ledger.peak_stored_bytes == 40 * per_token and cont.attention == {}
    assert cont.cache.shared_bytes() > 0  # by default the fork reads the prefill in place


def test_a_continuations_summary_adds_its_time_frames_and_any_quota_to_the_ledgers():
    ledger = PRLedger("generation", [LedgerEntry(3, 6, torch.tensor([[2, 4]]), 4)])  # PR 1 - 6 / 8
    cont = Continuation(latents=torch.zeros(1, 3, 6, 4, 5), ledger=ledger, kept_tokens={}, seconds=2.5, cache=None)
    want = {**ledger.summary(), "continuation_seconds": 2.5, "latent_frames": 6}  # frames: dim 2 of [B, C, F, h, w]
    assert cont.summary() == want and want["pruning_ratio"] == 0.25
    assert cont.summary(SimpleNamespace(quota_pr=None)) == want  # a method not in quota mode
    assert cont.summary(SimpleNamespace(quota_pr=0.4)) == {**want, "quota_pr": 0.4}


@pytest.mark.parametrize("share", [True, False])
def test_the_fork_has_room_for_the_whole_continuation_and_shares_the_prefill_unless_told(share):
    """4 frames of 4 tokens: the fork is made with 16 tokens of head-room, reading the prefill in place unless
    ``share_prefill=False``."""
    pre, _, backbone, _ = probing_prefill(Needs())
    seen = []
    continue_task(backbone, pre, "COND", 4, 7, share_prefill=share,
                  on_before_denoise=lambda cache, info: seen.append((cache.allocated_bytes(), cache.shared_bytes())))
    fork = pre.cache.fork(headroom=16, share=share)
    assert seen[0] == (fork.allocated_bytes(), fork.shared_bytes())
    assert (seen[0][1] > 0) == share
    assert pre.cache.fork(headroom=8, share=share).allocated_bytes() < seen[0][0]  # less room is less memory


def test_the_continuation_seeds_its_stochastic_steps_per_chunk():
    """Stochastic sampler: the second step's input re-noises step 0's x0 with noise (seed, "step", chunk)."""
    events: list = []
    backbone = SpyBackbone(events)
    settings = GenerationSettings(sampler=FlowMatchSampler((900.0, 500.0), stochastic=True))
    pre = prefill(backbone, Spy(), frames_valued(2), "COND", 0, settings)
    del backbone.inputs[:]
    continue_task(backbone, pre, "COND", 4, 9)
    for j in range(2):
        x0 = at_frames(2 + 2 * j, 2, 9 + 8 + 8 * j)
        eps = torch.randn((1, 3, 2, 4, 4), generator=seeded_generator(9, "step", 1 + j), dtype=torch.float32).to(DTYPE)
        assert torch.equal(backbone.inputs[3 * j + 1], renoise(x0, eps, 0.5))


def test_attention_is_recorded_at_the_first_call_of_the_asked_generated_chunks():
    """Zero queries at level 0.9 (the first step): generated chunk 1 (frames 8, 9) attends uniformly to 32
    history keys and its own 8, 4 keys per frame: 1/10 on each of frames 0-9."""
    events: list = []
    backbone = SpyBackbone(events, zero_queries_at=0.9)
    spy = Spy(events=events)
    pre = prefill(backbone, spy, frames_valued(6), "COND", 0, SETTINGS)
    cont = continue_task(backbone, pre, "COND", 4, 1, record_attention_at=(1,))
    assert sorted(cont.attention) == [1]
    stats = cont.attention[1]
    assert stats.num_frames == 10 and stats.key_frames is None and sorted(stats.mass) == [0, 1]
    torch.testing.assert_close(stats.mass[0], torch.full((2, 10), 0.1))
    assert spy.signals[-1].attention is stats and spy.signals[-2].attention is None


def test_the_methods_attention_chunk_is_recorded_over_its_key_frames_in_context_or_generation():
    """Needs.attention_chunk = 4 (generated chunk 1, frames 8, 9): over key frames (0, 9) only, zero queries
    split it 1/2 - 1/2; = 1 (context, frames 2, 3): recorded at its t = 0 pass over frames (0, 3)."""
    events: list = []
    backbone = SpyBackbone(events, zero_queries_at=0.9)
    spy = Spy(want=Needs(attention_chunk=4), events=events)
    cont = continue_task(backbone, prefill(backbone, spy, frames_valued(6), "COND", 0, SETTINGS), "COND", 4, 1)
    assert cont.attention == {}
    assert [s.attention is None for s in spy.signals] == [True, True, True, True, False]
    stats = spy.signals[-1].attention
    assert stats.key_frames == (0, 9) and stats.num_frames == 10
    want = torch.zeros(2, 10)
    want[:, 0] = want[:, 9] = 0.5
    torch.testing.assert_close(stats.mass[1], want)

    spy = Spy(want=Needs(attention_chunk=1))
    prefill(SpyBackbone([]), spy, frames_valued(6), "COND", 0, SETTINGS)
    assert [s.attention is None for s in spy.signals] == [True, False, True]
    stats = spy.signals[1].attention
    assert stats.key_frames == (0, 3) and stats.num_frames == 4
    mass = stats.mass[0]
    torch.testing.assert_close(mass.sum(-1), torch.ones(2))
    assert bool((mass[:, [1, 2]] == 0).all()) and bool((mass[:, [0, 3]] > 0).all())


def test_decision_time_and_wall_time_are_summed_per_phase(monkeypatch):
    """A fake clock from 1000 s: the method's hooks take 1 + 2 + 4 = 7 s per chunk, each model call 8 s.
    Prefill, 3 chunks of one call: decisions 21 s, wall 21 + 24 = 45 s. Continuation, 2 chunks of 3 steps
    and the t = 0 pass: decisions 14 s, wall 14 + 2 * 4 * 8 = 78 s."""
    clock = [1000.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    backbone = SpyBackbone([], clock=clock)
    spy = Spy(clock=clock)
    pre = prefill(backbone, spy, frames_valued(6), "COND", 0, SETTINGS)
    assert (pre.decide_seconds, pre.seconds) == (21.0, 45.0)
    cont = continue_task(backbone, pre, "COND", 4, 0)
    assert (cont.decide_seconds, cont.seconds) == (14.0, 78.0)


def test_a_method_with_a_history_cap_gets_a_cache_bounded_to_it_plus_one_chunk():
    pre = prefill(SpyBackbone([]), Spy(max_history_tokens=20), frames_valued(2), "COND", 0, SETTINGS)
    assert pre.cache.capacity_limit == 28  # 20 + 8 tokens of the open chunk
    assert prefill(SpyBackbone([]), Spy(), frames_valued(2), "COND", 0, SETTINGS).cache.capacity_limit is None


class SplitCache(KVCache):
    """A cache whose host store is one of three equal shares (as a split backbone's is)."""

    def store_shares(self) -> int:
        return 3


class SplitBackbone(SpyBackbone):
    """A backbone that builds its own caches (a split backbone's heads), logging the arguments."""

    def make_cache(self, geometry, layout, capacity_limit=None, compute_attention=True):
        self.made = (geometry, layout, capacity_limit, compute_attention)
        return SplitCache.from_geometry(geometry, layout, capacity_limit, compute_attention)


def test_a_backbone_that_builds_its_caches_gets_the_methods_layout_and_the_settings():
    store = HostStore()
    backbone = SplitBackbone([])
    method = Spy(max_history_tokens=16, store=store)
    settings = GenerationSettings(sampler=SAMPLER, compute_attention=False)
    pre = prefill(backbone, method, frames_valued(2), "COND", 0, settings)
    assert type(pre.cache) is SplitCache and backbone.made == (G, method.layout(G), 24, False)
    assert pre.cache.store is store and store.shares == 3 and pre.cache.compute_attention is False
    plain = prefill(SpyBackbone([]), Spy(), frames_valued(2), "COND", 0, SETTINGS)
    assert type(plain.cache) is KVCache and plain.cache.store is None and plain.cache.compute_attention is True


# --- poses -------------------------------------------------------------------------------------------------


def test_a_method_that_needs_poses_gets_the_tasks_and_is_refused_without_them():
    poses = torch.eye(4, dtype=torch.float64).expand(12, 4, 4)
    spy = Spy(want=Needs(poses=True))
    backbone = SpyBackbone([], poses=poses)
    assert camera_poses(backbone, spy, "COND") is poses
    assert camera_poses(backbone, Spy(), "COND") is None  # a method that does not ask gets none
    pre = prefill(backbone, spy, frames_valued(2), "COND", 0, SETTINGS)
    continue_task(backbone, pre, "COND", 2, 0)
    assert [b.poses is poses for b in spy.befores] == [True, True]
    why = (r"^spy: retrieves history by camera pose, but this task has no camera poses \(MiniWorld's camera plan "
           r"or a real task's camera extension gives them\); use a pose-free method such as key_retrieval$")
    with pytest.raises(ConfigError, match=why):
        camera_poses(backbone, spy, "another task")  # the backbone has no poses for this condition
    with pytest.raises(ConfigError, match=why):
        camera_poses(SimpleNamespace(), spy, "COND")  # a backbone with no camera_poses at all
    with pytest.raises(ConfigError, match="no camera poses"):
        continue_task(backbone, pre, "another task", 2, 0)


# --- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step, ok", [(None, True), (0, True), (1, True), (2, True), (3, False), (-1, False)])
def test_the_probe_step_must_name_one_of_three_steps(step, ok):
    method = Spy(want=Needs(probe_step=step))
    if ok:
        check_settings(method, SETTINGS)
        return
    msg = (f"spy: method.probe_step={step} names no step of the 3-step schedule (900.0, 500.0, 100.0): "
           f"it must be 0 .. 2 (zero-based)")
    with pytest.raises(ConfigError) as err:
        check_settings(method, SETTINGS)
    assert str(err.value) == msg
    events: list = []
    with pytest.raises(ConfigError, match="names no step of the 3-step schedule"):
        prefill(SpyBackbone(events), method, frames_valued(2), "COND", 0, SETTINGS)
    assert events == []  # refused before any model call
    pre = prefill(SpyBackbone(events), Spy(), frames_valued(2), "COND", 0, SETTINGS)
    with pytest.raises(ConfigError, match="names no step of the 3-step schedule"):
        continue_task(SpyBackbone(events), pre, "COND", 2, 0, method=method)


@pytest.mark.parametrize("shape, message", [
    ((1, 3, 2, 4), r"context latents must be \[B, 3, F, 4, 4\], got \(1, 3, 2, 4\)"),
    ((1, 4, 2, 4, 4), r"context latents must be \[B, 3, F, 4, 4\], got \(1, 4, 2, 4, 4\)"),
    ((1, 3, 2, 5, 4), r"got \(1, 3, 2, 5, 4\)"),
    ((1, 3, 2, 4, 5), r"got \(1, 3, 2, 4, 5\)"),
    ((1, 3, 3, 4, 4), r"^context latents has 3 latent frames, not a multiple of the chunk size 2$"),
])
def test_context_latents_of_the_wrong_shape_are_refused(shape, message):
    events: list = []
    with pytest.raises(ConfigError, match=message):
        prefill(SpyBackbone(events), Spy(), torch.zeros(shape, dtype=DTYPE), "COND", 0, SETTINGS)
    assert events == []


@pytest.mark.parametrize("frames", [0, -2, 3])
def test_a_continuation_length_must_be_a_positive_multiple_of_the_chunk(frames):
    pre = prefill(SpyBackbone([]), Spy(), frames_valued(2), "COND", 0, SETTINGS)
    with pytest.raises(ConfigError, match=rf"^continuation length {frames} must be a positive multiple of the chunk "
                                          r"size 2$"):
        continue_task(SpyBackbone([]), pre, "COND", frames, 0)


def test_one_frame_chunks_continue_one_frame():
    """``chunk_frames = 1``: a one-frame continuation is a positive multiple of the chunk."""
    g = fake_geometry(chunk_frames=1)
    backbone = ScriptedBackbone(g, frames_valued(3), torch.zeros(1, 3, 3, 4, 4, dtype=DTYPE))
    pre = prefill(backbone, Spy(), frames_valued(1), None, 0, SETTINGS)
    cont = continue_task(backbone, pre, None, 1, 0)
    assert cont.latents.shape == (1, 3, 1, 4, 4) and [e.full for e in cont.ledger.entries] == [4]


@pytest.mark.parametrize("method, name", [(OtherSpy(), "other"), (Spy(max_history_tokens=40), "spy")])
def test_a_continuation_method_must_have_the_prefills_class_and_layout(method, name):
    pre = prefill(SpyBackbone([]), Spy(), frames_valued(2), "COND", 0, SETTINGS)
    with pytest.raises(ConfigError, match=rf"^continue_task: method '{name}' does not match the prefill's 'spy'$"):
        continue_task(SpyBackbone([]), pre, "COND", 2, 0, method=method)
    # the same class and layout with other knobs is fine (and its own hooks run)
    other = Spy(recent_chunks=2)
    continue_task(SpyBackbone([]), pre, "COND", 2, 0, method=other)
    assert [s.chunk.index for s in other.signals] == [1]
