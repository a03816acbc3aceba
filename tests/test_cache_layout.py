"""Head-group layouts (cache/layout.py) and the attention-mass recorder's arithmetic (cache/attention_stats.py):
validation and its messages, the uniform layout's fields, the query blocking that bounds the float32 logits,
and frame_mass's dtype and device whatever torch's defaults are."""

import math

import numpy as np
import pytest
import torch

from cmbench.cache.attention_stats import BLOCK_BYTES, AttentionStats, blocked_frame_mass, frame_mass, query_block
from cmbench.cache.layout import HeadGroup, check_partition, uniform_layout
from cmbench.errors import ConfigError


# --- HeadGroup ---------------------------------------------------------------------------------------------

def test_head_group_stores_heads_as_a_tuple_of_python_ints():
    """Whatever sequence of integer-likes is given, ``heads`` becomes a tuple of ``int`` (hashable, comparable
    with tuples): the banks index with it and layouts compare groups by it."""
    group = HeadGroup([0, np.int64(2), torch.tensor(5)])
    assert group.heads == (0, 2, 5)
    assert type(group.heads) is tuple
    assert [type(h) for h in group.heads] == [int, int, int]
    assert hash(group) == hash(HeadGroup((0, 2, 5)))


def test_head_group_without_heads_is_refused_with_its_message():
    with pytest.raises(ConfigError) as err:
        HeadGroup(())
    assert str(err.value) == "a head group needs at least one head"


@pytest.mark.parametrize("heads", [(1, 1), (0, 2, 2), (0, 2, 1)])
def test_head_group_heads_must_be_strictly_increasing(heads):
    """A repeated head (equal neighbours) is refused as well as a decrease, also one after the first pair."""
    with pytest.raises(ConfigError) as err:
        HeadGroup(heads)
    assert str(err.value) == f"head group heads must be strictly increasing, got {heads}"


def test_head_group_max_tokens_zero_is_allowed_negative_refused():
    """A bank may be sized to hold no history at all (0 tokens); only a negative size is an error."""
    assert HeadGroup((0,), max_tokens=0).max_tokens == 0
    assert HeadGroup((0,), max_tokens=1).max_tokens == 1
    with pytest.raises(ConfigError) as err:
        HeadGroup((0,), max_tokens=-1)
    assert str(err.value) == "head group max_tokens must be >= 0, got -1"


# --- uniform_layout ----------------------------------------------------------------------------------------

def test_uniform_layout_defaults_one_all_bank_per_layer_unsized():
    layout = uniform_layout(3, 4)
    assert [[(g.heads, g.role, g.max_tokens) for g in layer] for layer in layout] == [[((0, 1, 2, 3), "all", None)]] * 3


def test_uniform_layout_passes_role_and_size_to_every_layer():
    layout = uniform_layout(2, 3, "static", 7)
    assert [[(g.heads, g.role, g.max_tokens) for g in layer] for layer in layout] == [[((0, 1, 2), "static", 7)]] * 2
    assert uniform_layout(1, 2, max_tokens=5)[0][0].max_tokens == 5
    assert uniform_layout(1, 2, role="dynamic")[0][0].role == "dynamic"


# --- check_partition ---------------------------------------------------------------------------------------

def test_check_partition_accepts_an_exact_partition_in_any_group_order():
    check_partition([HeadGroup((1, 3)), HeadGroup((0, 2))], 4, "layer 0")


@pytest.mark.parametrize("groups, seen", [
    ([HeadGroup((0, 1)), HeadGroup((2,))], [0, 1, 2]),        # head 3 missing
    ([HeadGroup((0, 1, 2)), HeadGroup((2, 3))], [0, 1, 2, 2, 3]),  # head 2 twice
    ([HeadGroup((0, 1, 2, 3, 4))], [0, 1, 2, 3, 4]),            # a head past the last
])
def test_check_partition_message_names_where_the_range_and_the_heads_seen(groups, seen):
    with pytest.raises(ConfigError) as err:
        check_partition(groups, 4, "layer 5")
    assert str(err.value) == f"layer 5: head groups must partition heads 0..3 exactly once, got {seen}"


# --- query_block -------------------------------------------------------------------------------------------

def test_query_block_is_the_most_query_rows_whose_float32_logits_fit():
    """rows * batch * keys * 4 bytes <= block_bytes, the largest such rows."""
    assert query_block(2, 6, 144) == 3  # 3 rows of 2 x 6 float32 logits = 144 bytes exactly
    assert query_block(2, 6, 143) == 2
    assert query_block(1, 1, 40) == 10  # one key: 4 bytes per row
    assert query_block(3, 1, 12) == 1
    assert query_block(1, 2**20) == BLOCK_BYTES // (4 * 2**20) == 64


def test_query_block_counts_no_keys_as_one_and_gives_at_least_one_row():
    assert query_block(1, 0, 40) == 10
    assert query_block(2, 10, 1) == 1  # not even one row fits: still one, never zero
    assert query_block(2, 10, 80) == 1  # exactly one row fits


# --- frame_mass --------------------------------------------------------------------------------------------

WEIGHTS = (1.0, 1.0, 2.0, 4.0, 4.0, 4.0)  # head 1's softmax weights over the 6 keys (sum 16)
FRAMES = (0, 0, 1, 2, 2, 2)  # source frame of each key; frame 3 has no key


def known_attention(batch=2, length=7, device="cpu"):
    """q, k with D=4 (scale 1/2) whose softmax is known by hand: head 0 has zero queries (uniform over the 6
    keys); head 1's query (1, 0, 0, 0) meets keys (2 ln w_j, 0, 0, 0), logits ln w_j, softmax w_j / 16."""
    q = torch.zeros(batch, length, 2, 4)
    k = torch.randn(batch, 6, 2, 4, generator=torch.Generator().manual_seed(0))
    q[:, :, 1] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    k[:, :, 1] = 0.0
    k[:, :, 1, 0] = 2 * torch.tensor([math.log(w) for w in WEIGHTS])
    return q.to(device), k.to(device), torch.tensor(FRAMES, device=device)


# mass per frame 0..3: head 0 counts keys per frame / 6; head 1 sums w over the frame / 16
EXPECTED = torch.tensor([[2 / 6, 1 / 6, 3 / 6, 0.0], [2 / 16, 2 / 16, 12 / 16, 0.0]])


def test_frame_mass_by_hand_sums_every_query_block():
    """With a block of 3 query rows (7 queries: blocks 3, 3, 1) every block's softmax is added in, so the
    mean over batch and queries is the per-query mass; rows sum to 1."""
    q, k, frames = known_attention()
    got = frame_mass(q, k, frames, 4, block_bytes=4 * 2 * 6 * 3)
    torch.testing.assert_close(got, EXPECTED, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.sum(1), torch.ones(2), rtol=0, atol=1e-6)


def test_frame_mass_logits_blocks_stay_within_block_bytes(monkeypatch):
    """The recorder's memory bound: each logits matmul is [B, rows, N] with rows = query_block(B, N,
    block_bytes), so no block's float32 logits exceed block_bytes; 7 queries in blocks of 3 rows, per head."""
    shapes = []
    matmul = torch.matmul

    def spy(a, b):
        out = matmul(a, b)
        shapes.append(tuple(out.shape))
        return out

    q, k, frames = known_attention()
    budget = 4 * 2 * 6 * 3  # B=2, N=6 keys, 3 rows
    monkeypatch.setattr(torch, "matmul", spy)
    got = frame_mass(q, k, frames, 4, block_bytes=budget)
    monkeypatch.undo()
    assert shapes == [(2, 3, 6), (2, 3, 6), (2, 1, 6)] * 2
    assert max(4 * math.prod(s) for s in shapes) <= budget
    torch.testing.assert_close(got, EXPECTED, rtol=0, atol=1e-6)


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def test_frame_mass_is_float32_whatever_the_default_dtype(float64_default):
    """The accumulator and the result are float32 by choice, not by torch's default dtype: under a float64
    default the result is still float32 (and the same numbers)."""
    q, k, frames = known_attention()
    got = frame_mass(q.float(), k.float(), frames, 4, block_bytes=4 * 2 * 6 * 3)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, EXPECTED.float(), rtol=0, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_frame_mass_accumulates_on_the_queries_device_and_returns_on_the_cpu():
    """Queries and keys on the GPU: the per-key accumulator lives there too (adding GPU blocks into a CPU
    accumulator fails), and the [Hg, F] result comes back float32 on the CPU."""
    q, k, frames = known_attention(device="cuda")
    got = frame_mass(q, k, frames, 4, block_bytes=4 * 2 * 6 * 3)
    assert got.device.type == "cpu" and got.dtype == torch.float32
    torch.testing.assert_close(got, EXPECTED, rtol=0, atol=1e-5)
    stats = AttentionStats(num_frames=4, key_frames=(0, 2))
    chosen = stats.of(q, lambda: [(k, frames.cpu(), None)])
    assert chosen.device.type == "cpu"
    bias = torch.zeros(6, device="cuda")
    blocked = stats.of(q, in_blocks(k, frames.cpu(), (2, 3, 1), bias))  # keys and bias on the GPU, frames on the CPU
    torch.testing.assert_close(blocked, chosen, rtol=0, atol=1e-5)


def in_blocks(k, frames, sizes, bias=None):
    """The keys cut into blocks of these sizes, as ``blocked_frame_mass`` reads them (a fresh list per pass)."""
    cuts = torch.tensor(sizes).cumsum(0).tolist()
    starts = [0, *cuts[:-1]]
    return lambda: [(k[:, a:b], frames[a:b], None if bias is None else bias[a:b]) for a, b in zip(starts, cuts)]


@pytest.mark.parametrize("sizes", [(2, 3, 1), (1, 1, 1, 1, 1, 1), (5, 1)])
def test_frame_mass_over_blocks_normalises_over_every_block(sizes):
    """Keys in blocks give the mass of the whole softmax (head 1's weights w / 16 whatever the cut), not a
    softmax per block nor one over the last block's keys."""
    q, k, frames = known_attention()
    got = blocked_frame_mass(q, in_blocks(k, frames, sizes), 4, block_bytes=4 * 2 * 6 * 3)
    torch.testing.assert_close(got, EXPECTED, rtol=0, atol=1e-6)


def test_frame_mass_over_blocks_adds_each_blocks_bias_to_its_own_keys():
    """A bias per key (a merged row's log(count)) enters both passes at its own key: the blocked mass equals
    the one-block mass with the same bias, which differs from the unbiased one."""
    q, k, frames = known_attention()
    bias = torch.tensor([0.0, math.log(3.0), 0.0, 0.0, math.log(2.0), 0.0])
    one = frame_mass(q, k, frames, 4, bias=bias)
    got = blocked_frame_mass(q, in_blocks(k, frames, (2, 2, 2), bias), 4)
    torch.testing.assert_close(got, one, rtol=0, atol=1e-6)
    assert (one - EXPECTED).abs().max() > 0.05
    # head 1 by hand: weights 1, 3, 2, 4, 8, 4 over frames 0, 0, 1, 2, 2, 2 (sum 22)
    torch.testing.assert_close(got[1], torch.tensor([4 / 22, 2 / 22, 16 / 22, 0.0]), rtol=0, atol=1e-6)


def test_one_block_is_frame_mass_itself_and_no_block_is_an_error():
    q, k, frames = known_attention()
    assert torch.equal(blocked_frame_mass(q, in_blocks(k, frames, (6,)), 4), frame_mass(q, k, frames, 4))
    with pytest.raises(ValueError, match=r"^attention statistics need at least one block of keys$"):
        blocked_frame_mass(q, lambda: [], 4)


def test_chosen_key_frames_are_taken_from_every_block():
    """key_frames (0, 2) over keys in blocks: the same renormalised mass as over the keys in one block."""
    q, k, frames = known_attention()
    stats = AttentionStats(num_frames=4, key_frames=(0, 2))
    torch.testing.assert_close(stats.of(q, in_blocks(k, frames, (1, 2, 3))), stats.of(q, in_blocks(k, frames, (6,))),
                               rtol=0, atol=1e-6)


def test_frame_mass_over_blocks_is_float32_whatever_the_default_dtype(float64_default):
    """The normaliser and the accumulators are float32 by choice (the logits' memory bound counts 4 bytes each):
    under a float64 default the blocked mass is the same float32 bits as under a float32 default."""
    q, k, frames = known_attention()
    blocks = in_blocks(k.float(), frames, (2, 3, 1))
    got = blocked_frame_mass(q.float(), blocks, 4, block_bytes=4 * 2 * 6 * 3)
    torch.set_default_dtype(torch.float32)
    want = blocked_frame_mass(q.float(), blocks, 4, block_bytes=4 * 2 * 6 * 3)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    torch.testing.assert_close(got, EXPECTED.float(), rtol=0, atol=1e-6)


def test_a_float64_bias_leaves_the_logits_float32():
    """A bias given in float64 is added to float32 logits in float32 (the mass is the float32 bias's, bit for
    bit), so the logits' memory bound holds whatever the bias's dtype."""
    q, k, frames = known_attention()
    bias = torch.tensor([0.0, math.log(3.0), 0.0, 0.0, math.log(2.0), 0.0])
    for fn in (lambda b: frame_mass(q, k, frames, 4, bias=b),
               lambda b: blocked_frame_mass(q, in_blocks(k, frames, (2, 2, 2), b), 4)):
        assert torch.equal(fn(bias.double()), fn(bias))


# --- AttentionStats ----------------------------------------------------------------------------------------

def test_attention_stats_of_renormalises_over_the_chosen_key_frames():
    """key_frames (0, 2): keys of frame 1 leave the softmax; head 0 is uniform over the 5 left, head 1's
    weights over them sum to 14."""
    q, k, frames = known_attention()
    got = AttentionStats(num_frames=4, key_frames=(0, 2)).of(q, lambda: [(k, frames, None)])
    expected = torch.tensor([[2 / 5, 0.0, 3 / 5, 0.0], [2 / 14, 0.0, 12 / 14, 0.0]])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_attention_stats_stacked_in_layer_order_and_its_message_when_empty():
    stats = AttentionStats(num_frames=2)
    with pytest.raises(RuntimeError) as err:
        stats.stacked()
    assert str(err.value) == "no attention was recorded (no attend call while recording)"
    stats.mass[3] = torch.full((1, 2), 3.0)
    stats.mass[1] = torch.full((1, 2), 1.0)
    assert stats.stacked().tolist() == [[[1.0, 1.0]], [[3.0, 3.0]]]
