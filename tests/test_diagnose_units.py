"""`diagnose`'s bookkeeping without a model: a place counts as still cached when ANY bank of ANY layer
holds a token showing it, and the summary's confidence intervals are clustered by context."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from cmbench.cache import HeadGroup, KVCache
from cmbench.paper.diagnose import cached_places, summarise, token_groups
from cmbench.report.statistics import clustered_mean_ci
from fakes import fake_geometry

G = fake_geometry(num_layers=2, num_heads=2, head_dim=6)  # 4 tokens per frame, chunks of 2 frames
T = G.tokens_per_frame
# layer 0: one bank of both heads; layer 1: one bank per head (layers and head groups keep different tokens)
LAYOUT = [[HeadGroup((0, 1))], [HeadGroup((0,)), HeadGroup((1,))]]


def split_cache() -> KVCache:
    """Chunks 0..2 (frames 0..5) committed, then compacted differently per bank.

    - layer 0 (heads 0, 1): chunk 0 whole (frames 0 and 1);
    - layer 1, head 0: frame 2, positions 0 and 1;
    - layer 1, head 1: frame 4, position 0.

    Nothing else of chunks 1 and 2 is held anywhere.
    """
    cache = KVCache.from_geometry(G, LAYOUT)
    for c in range(3):
        info = cache.begin_chunk(c, c * G.chunk_frames, G.chunk_frames)
        for layer in range(G.num_layers):
            k = torch.randn(1, info.length, G.num_heads, G.head_dim, generator=torch.Generator().manual_seed(c))
            cache.attend(layer, k, k, k)
        cache.commit_chunk()

    def keep(bank) -> torch.Tensor:
        frame, pos = bank.field("frame"), bank.field("pos")
        if bank.layer == 0:
            return frame <= 1
        if bank.heads.tolist() == [0]:
            return (frame == 2) & (pos <= 1)
        return (frame == 4) & (pos == 0)

    cache.compact(keep)
    return cache


def place_map() -> np.ndarray:
    """Places ``int [8, T]``: frames 0..5 show places ``frame * T + pos`` (each once); chunk 3 (frames 6
    and 7) shows places 0, 1 (chunk 0), 8, 9 (frame 2), 16, 17 (frame 4) and the new places 100, 101."""
    places = np.arange(6 * T).reshape(6, T)
    return np.concatenate([places, [[0, 1, 8, 9], [16, 17, 100, 101]]])


def test_a_place_is_cached_when_any_layer_or_head_group_still_holds_it():
    """The layers keep different tokens: layer 0 holds chunk 0, layer 1's two head groups hold places 8, 9
    and 16 only. Every one of them is cached; the rest of chunks 1 and 2 is not."""
    cache = split_cache()
    assert [bank.n for bank in cache.all_banks()] == [2 * T, 2, 1]  # the state the test means
    assert cached_places(cache, place_map()) == {*range(2 * T), 8, 9, 16}


def test_chunk_groups_follow_every_layers_cache():
    """Chunk 3's tokens: places still held by layer 0 (0, 1) or only by one of layer 1's head groups
    (8, 9, 16) are ``seen_cached``; place 17 (shown by frame 4, held by no bank) is ``seen_pruned``;
    100 and 101 are ``new``."""
    cache = split_cache()
    places = place_map()
    info = cache.begin_chunk(3, 6, G.chunk_frames)
    groups, age = token_groups(places, info, cached_places(cache, places))
    assert groups.tolist() == ["seen_cached"] * 5 + ["seen_pruned"] + ["new"] * 2
    # chunks since the place was last shown: frame 0 -> 3, frame 2 -> 2, frame 4 -> 1
    assert age[:6].tolist() == [3.0, 3.0, 2.0, 2.0, 1.0, 1.0] and np.isnan(age[6:]).all()


def test_a_place_held_by_layer_0_only_is_still_cached():
    """The converse: a place that no bank of layer 1 holds but layer 0 does is cached."""
    cache = split_cache()
    cache.compact(lambda bank: bank.field("frame") >= 0 if bank.layer == 0 else bank.field("frame") < 0)
    assert [bank.n for bank in cache.all_banks()] == [2 * T, 0, 0]
    assert cached_places(cache, place_map()) == set(range(2 * T))


def cluster_rows() -> pd.DataFrame:
    """Diagnosis rows of one (arm, group, step) cell: 3 contexts x 3 chunks, the chunk indices shared by
    the contexts. Context means 1, 2 and 6 spread widely; within a context the chunks differ little."""
    errors = {"a": [0.9, 1.0, 1.1], "b": [2.2, 1.9, 1.9], "c": [6.0, 6.3, 5.7]}
    return pd.DataFrame([{"context_id": ctx, "chunk": chunk, "arm": "method", "step": 1, "timestep": 957.0,
                          "group": "seen_cached", "error": e}
                         for ctx, values in errors.items() for chunk, e in enumerate(values)])


def test_summary_ci_is_clustered_by_context_not_by_chunk():
    """The chunks of one context are not independent: the 95% CI uses the contexts as clusters. Here the
    contexts spread far more than the chunks, so clustering by chunk index would give a much narrower
    interval."""
    rows = cluster_rows()
    (cell,) = summarise(rows).to_dict("records")
    mean, by_context = clustered_mean_ci(rows["error"], rows["context_id"])
    _, by_chunk = clustered_mean_ci(rows["error"], rows["chunk"])
    assert by_chunk < by_context / 5  # the case tells the two clusterings apart
    assert cell["error"] == pytest.approx(mean) == pytest.approx(rows["error"].mean())
    assert cell["ci95"] == pytest.approx(by_context, rel=1e-12)
    assert (cell["chunks"], cell["contexts"]) == (9, 3)


def test_summary_ci_is_undefined_with_one_context_however_many_chunks():
    """One context is one cluster: no interval (NaN), even with several chunks."""
    rows = cluster_rows()
    (cell,) = summarise(rows[rows["context_id"] == "c"]).to_dict("records")
    assert cell["error"] == pytest.approx(6.0) and math.isnan(cell["ci95"])


@pytest.mark.parametrize("contexts_of_b", [[], ["c2"]], ids=["b-absent", "no-shared-context"])
def test_groups_that_share_no_context_compare_as_nothing_measured(contexts_of_b):
    """Paired over contexts: a group that is absent, or present only in contexts the other lacks, gives a
    comparison of the two named groups with no difference, no CI, 0 contexts, and an inconclusive verdict."""
    from cmbench.paper.criteria import INCONCLUSIVE
    from cmbench.paper.diagnose import Comparison, compare_groups

    rows = pd.DataFrame([{"arm": "method", "step": 1, "context_id": "c1", "group": "seen_cached", "error": 0.2}]
                        + [{"arm": "method", "step": 1, "context_id": c, "group": "new", "error": 0.5}
                           for c in contexts_of_b])
    got = compare_groups(rows, "method", 1, "seen_cached", "new")
    assert isinstance(got, Comparison) and (got.a, got.b, got.contexts) == ("seen_cached", "new", 0)
    assert math.isnan(got.difference) and math.isnan(got.ci95) and got.verdict == INCONCLUSIVE
