"""A task's fork reads the prefilled KV in place: identical continuations, the prefill never written, and
only the task's own chunks (plus the prefilled chunks its compaction touches) allocated."""

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.generation import continue_task, prefill
from cmbench.methods import build_method
from cmbench.methods.head_map import HeadMap
from fakes import AttentionBackbone, fake_geometry

G = fake_geometry(num_layers=2, num_heads=2, head_dim=12)
CONTEXT = torch.randn(1, 3, 12, 4, 4, generator=torch.Generator().manual_seed(5))  # 6 context chunks


def state(cache: KVCache) -> list:
    return [(b.history()[0].clone(), b.history()[1].clone(), {n: b.field(n).clone() for n in b.PROVENANCE})
            for b in cache.all_banks()]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(ka, kb) and torch.equal(va, vb) and all(torch.equal(pa[n], pb[n]) for n in pa)
        for (ka, va, pa), (kb, vb, pb) in zip(a, b))


def method_config(name: str, tmp_path) -> dict:
    path = tmp_path / "map.json"
    HeadMap(2, 2, ((), (1,))).save(path)
    extra = {"decoprune_hs": {"head_map": str(path)}, "forcingkv": {"head_map": str(path), "k": 6},
             "tempdiff": {"k": 6}, "decoprune@budget": {"quota_pr": 0.5}, "decoprune@bounded":
             {"max_history_tokens": 30}}
    return {"name": name.split("@")[0], **extra.get(name, {})}


@pytest.mark.parametrize("name", ["fullkv", "streaming", "decoprune", "decoprune_reverse", "decoprune_hs", "random",
                                  "tempdiff", "forcingkv", "dummyforcing", "decoprune@budget", "decoprune@bounded"])
def test_shared_fork_equals_a_copy_and_leaves_the_prefill_alone(name, tmp_path):
    method = build_method(method_config(name, tmp_path))
    backbone = AttentionBackbone(G, seed=1)
    pre = prefill(backbone, method, CONTEXT, None, 0)
    before = state(pre.cache)
    shared = continue_task(backbone, pre, None, 8, 11)
    assert same(before, state(pre.cache))  # the prefilled cache is never written
    assert any(b.shared is not None for b in shared.cache.all_banks()) or name in ("streaming", "dummyforcing")
    again = continue_task(backbone, pre, None, 8, 11)  # a second task sees the same prefill
    copied = continue_task(backbone, pre, None, 8, 11, share_prefill=False)
    for cont in (shared, again):
        assert torch.equal(cont.latents, copied.latents)
        assert cont.summary(method) | {"continuation_seconds": 0} == copied.summary(method) | {"continuation_seconds": 0}
        assert cont.kept_tokens == copied.kept_tokens
        assert same(state(cont.cache), state(copied.cache))
    assert shared.cache.allocated_bytes() <= copied.cache.allocated_bytes()


def test_fullkv_fork_allocates_only_its_continuation():
    backbone = AttentionBackbone(G, seed=1)
    pre = prefill(backbone, build_method({"name": "fullkv"}), CONTEXT, None, 0)
    pre.cache.trim()
    prefilled = pre.cache.allocated_bytes()
    frames = 8
    cont = continue_task(backbone, pre, None, frames, 3)
    row = 2 * G.num_heads * G.head_dim * 4  # K and V of one token, float32, every head of a layer
    kv = sum(2 * b.k.numel() * b.k.element_size() for b in cont.cache.all_banks())
    assert kv == G.num_layers * frames * G.tokens_per_frame * row
    assert cont.cache.shared_bytes() == sum(b.stored_bytes() for b in pre.cache.all_banks())
    assert cont.cache.stored_bytes() == cont.cache.shared_bytes() + kv  # every continuation row is its own
    assert pre.cache.allocated_bytes() == prefilled


def test_compaction_copies_from_the_touched_chunk_on():
    """DeCoPrune compacts the chunk two back right before each clean pass: the first generated chunk
    compacts the last-but-one context chunk, so the fork owns rows from that chunk on."""
    backbone = AttentionBackbone(G, seed=1)
    pre = prefill(backbone, build_method({"name": "decoprune", "gamma": 0.05}), CONTEXT, None, 0)
    cont = continue_task(backbone, pre, None, 2, 3)
    for fork_bank, pre_bank in zip(cont.cache.all_banks(), pre.cache.all_banks()):
        if torch.equal(fork_bank.field("gid")[: pre_bank.n], pre_bank.field("gid")):
            continue  # nothing of the prefill dropped in this bank
        assert fork_bank.base == int((pre_bank.field("chunk") < 4).sum())  # context chunks 0..5; chunk 4 touched
        assert torch.equal(fork_bank.shared[0], pre_bank.history()[0][:, : fork_bank.base])


def test_reindex_and_move_of_a_fork_never_write_the_prefill():
    backbone = AttentionBackbone(G, seed=1)
    pre = prefill(backbone, build_method({"name": "fullkv"}), CONTEXT, None, 0)
    before = state(pre.cache)
    fork = pre.cache.fork(headroom=8)
    fork.reindex(12, 1, 3.0)
    assert all(b.shared is None for b in fork.all_banks())
    other = pre.cache.fork(headroom=8)
    other.trim()
    assert same(before, state(pre.cache))
    assert same(state(other), before)
