"""TempCache's correspondence search: each leaving key's nearest earlier key by cosine, at any in-frame position
of the ``search_frames`` frames before, exact or through a FAISS HNSW shortlist; on keys as stored or with
their temporal rotation removed. ``tempcache_samepos`` keeps the same-position matcher (tests/test_tempcache.py).

Caches here: one layer, one head of dim 8 (or 12 with RoPE), 4 tokens a frame, chunks of one frame.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cmbench.cache.kv_cache import KVCache
from cmbench.cache.rope import RopeAxis, RopeSpec, apply_rotary
from cmbench.errors import ConfigError
from cmbench.methods import build_method
from cmbench.methods.tempcache import SamePositionTempCache, TempCache, merge_pairs, nearest_pairs
from cmbench.methods.tempcache_search import approximate_nearest, exact_nearest, unit_keys

needs_faiss = pytest.mark.skipif(importlib.util.find_spec("faiss") is None,
                                 reason="faiss-cpu is not installed: pip install -e '.[ann]'")
T = 4  # tokens a frame
FLAT = RopeSpec(RopeAxis(2), RopeAxis(2), RopeAxis(4))  # temporal pairs rotate; positions given by frame


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def cache_of(frames: list[torch.Tensor], rope: RopeSpec = FLAT) -> KVCache:
    """A cache whose chunk ``c`` (one frame) stores the keys ``frames[c] [1, T, 1, D]`` (values: the frame index)."""
    d = frames[0].shape[-1]
    cache = KVCache(1, 1, d, T, rope)
    for c, k in enumerate(frames):
        cache.begin_chunk(c, c, 1)
        cache.attend(0, k, k, torch.full_like(k, float(c)))
        cache.commit_chunk()
    return cache


def panning(seed: int = 0) -> list[torch.Tensor]:
    """Frame 0: four distinct keys a b c d; frame 1: the camera panned one token: x a b c (x new content)."""
    a = randn(1, T + 1, 1, 8, seed=seed)
    return [a[:, :T], torch.cat([a[:, T:], a[:, : T - 1]], dim=1)]


def test_a_panned_key_merges_into_the_earlier_key_at_another_position():
    cache = cache_of(panning())
    bank = cache.banks[0][0]
    into, rows = nearest_pairs(bank, 1, 0.999, search_frames=1, exact_limit=10**6)
    assert into.tolist() == [0, 1, 2] and rows.tolist() == [5, 6, 7]  # a b c at positions 1 2 3 -> 0 1 2
    pos = bank.field("pos")
    assert (pos[into] != pos[rows]).all()  # each merged into a DIFFERENT position
    assert merge_pairs(bank, 1, 0.999)[0].tolist() == []  # the same-position matcher finds none of them
    method = TempCache(threshold=0.999, sink_chunks=0, recent_chunks=0)
    cache.merge(method.merge_selector(cache.chunks[-1], cache.rope))
    assert bank.field("gid").tolist() == [0, 1, 2, 3, 4] and bank.counts().tolist() == [2, 2, 2, 1, 1]
    values = bank.history()[1][0, :, 0, 0]
    assert values.tolist() == [0.5, 0.5, 0.5, 0.0, 1.0]  # averaged by count: frame 0's 0 and frame 1's 1


def test_the_exact_search_is_the_top_cosine_lowest_over_the_batch_earliest_on_ties():
    q = unit_keys(randn(2, 5, 2, 3, seed=1))
    c = unit_keys(randn(2, 7, 2, 3, seed=2))
    c = torch.cat([c, c[:, 3:4]], dim=1)  # candidate 7 repeats candidate 3: a tie goes to 3
    index, cosine = exact_nearest(q, c)
    brute = torch.einsum("bme,bne->bmn", q, c).amin(0)
    assert index.tolist() == brute.argmax(1).tolist() and 7 not in index.tolist()
    torch.testing.assert_close(cosine, brute.max(1).values)
    q[:, 0] = c[:, 3]
    assert exact_nearest(q, c)[0][0] == 3


@needs_faiss
def test_the_hnsw_shortlist_finds_what_the_exact_search_finds_on_separated_keys():
    c = unit_keys(randn(1, 400, 2, 8, seed=3))
    q = unit_keys(c[:, torch.arange(0, 400, 7)].unflatten(-1, (2, 8)) + 0.01 * randn(1, 58, 2, 8, seed=4))
    exact = exact_nearest(q, c)
    approx = approximate_nearest(q, c)
    assert approx[0].tolist() == exact[0].tolist() == list(range(0, 400, 7))
    torch.testing.assert_close(approx[1], exact[1])
    cache = cache_of(panning())  # above exact_limit the same pairs come through the index
    assert [t.tolist() for t in nearest_pairs(cache.banks[0][0], 1, 0.999, 1, exact_limit=0)] == [[0, 1, 2], [5, 6, 7]]


def test_only_the_search_frames_before_a_frame_are_searched_and_merged_rows_are_not_targets():
    a = randn(1, T, 1, 8, seed=5)
    other = randn(1, T, 1, 8, seed=6)
    cache = cache_of([a, other, other * -1.0, a, a])  # frame 3 repeats frame 0, three frames back
    bank = cache.banks[0][0]
    assert nearest_pairs(bank, 3, 0.999, search_frames=2, exact_limit=10**6)[0].tolist() == []
    into, rows = nearest_pairs(bank, 3, 0.999, search_frames=3, exact_limit=10**6)
    assert into.tolist() == [0, 1, 2, 3] and rows.tolist() == [12, 13, 14, 15]
    # within one pass, a row merged away is no target: chunk 1 of two frames b, b (b near a) both fold into a,
    # although frame 2's nearest key is frame 1's identical b
    b = a + 0.01 * randn(1, T, 1, 8, seed=8)
    two = KVCache(1, 1, 8, T, FLAT)
    for c, (start, frames, keys) in enumerate([(0, 1, a), (1, 2, torch.cat([b, b], dim=1))]):
        two.begin_chunk(c, start, frames)
        two.attend(0, keys, keys, keys)
        two.commit_chunk()
    into, rows = nearest_pairs(two.banks[0][0], 1, 0.99, search_frames=2, exact_limit=10**6)
    assert into.tolist() == [0, 1, 2, 3] * 2 and rows.tolist() == list(range(4, 12))


def rotated(content: torch.Tensor, t: float) -> torch.Tensor:
    """``content [1, T, 1, D]`` rotated at time ``t`` (spatial positions 0) as the model caches it."""
    positions = torch.tensor([[t, 0.0, 0.0]] * T)
    return apply_rotary(content, *FLAT.cos_sin(positions))


def test_content_matching_removes_the_temporal_rotation_and_rotated_matching_does_not():
    content = randn(1, T, 1, 8, seed=7)
    cache = cache_of([rotated(content, 0.0), rotated(content, 1.0)])  # the same content one frame later
    bank = cache.banks[0][0]
    rope = cache.rope
    assert nearest_pairs(bank, 1, 0.999, 1, 10**6, rope)[0].tolist() == [0, 1, 2, 3]
    assert nearest_pairs(bank, 1, 0.999, 1, 10**6, None)[0].tolist() == []  # the rotation alone lowers the cosine
    by_content = TempCache(threshold=0.999, sink_chunks=0, recent_chunks=0, match_on="content")
    by_key = TempCache(threshold=0.999, sink_chunks=0, recent_chunks=0)
    assert by_content.merge_selector(cache.chunks[-1], rope)(bank)[0].tolist() == [0, 1, 2, 3]
    assert by_key.merge_selector(cache.chunks[-1], rope)(bank)[0].tolist() == []


@pytest.mark.parametrize("knobs, message", [
    ({"match_on": "pixels"}, "method tempcache: match_on='pixels': expected one of rotated, content"),
    ({"search_frames": 0}, "method tempcache: search_frames must be a whole number >= 1, got 0"),
])
def test_a_bad_knob_is_one_line_naming_it(knobs, message):
    with pytest.raises(ConfigError) as err:
        build_method({"name": "tempcache", **knobs})
    assert str(err.value) == message


def test_the_same_position_matcher_is_registered_under_its_own_name():
    method = build_method({"name": "tempcache_samepos", "threshold": 0.5})
    assert type(method) is SamePositionTempCache and method.family == "merging"
    cache = cache_of(panning())
    assert method.merge_selector(cache.chunks[-1])(cache.banks[0][0])[0].tolist() == []
