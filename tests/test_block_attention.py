"""Attention over keys in blocks (cache/block_attention.py) and a quantized bank's attention decoding its
history one block at a time (QuantizedBank.blocks): equal to attention over every key at once, with no call
ever decoding more than a block of history rows.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cmbench.benchmarks.kv_bytes import CpuMeter
from cmbench.cache import block_attention, quantized_bank
from cmbench.cache.attention_stats import frame_mass
from cmbench.cache.kv_cache import KVCache
from cmbench.cache.quantized import StorageFormat
from cmbench.cache.quantized_bank import QuantizedBank
from cmbench.cache.rope import RopeSpec

D, H, T = 32, 2, 16
L = 2 * T
KIVI = StorageFormat("kivi", bits=4, group_size=16, residual=8)
QVG = StorageFormat("qvg", bits=2, group_size=16, residual=0, stages=2, clusters=4, iters=3)


@pytest.fixture(params=["fused", "float32 logits"])
def kernel(request, monkeypatch):
    """Each way a block's partial attention is computed: torch's fused CPU kernel, and the float32 logits
    used on every other device."""
    if request.param != "fused":
        monkeypatch.setattr(block_attention, "_FUSED", None)
    elif block_attention._FUSED is None:
        pytest.skip("this torch has no fused CPU attention kernel returning the log-sum-exp")
    return request.param


def sdpa(q, k, v, bias=None):
    """Plain attention over every key, ``q [B, L, H, D]``, ``k, v [B, N, H, D]``, ``bias [N]``."""
    mask = None if bias is None else bias.expand(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
def test_blocks_combine_into_attention_over_every_key(kernel, with_bias):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 7, 3, 16, generator=g) * 3  # sharp softmax: a block's max dominates
    sizes = [5, 64, 1, 30]
    k, v = torch.randn(2, sum(sizes), 3, 16, generator=g) * 3, torch.randn(2, sum(sizes), 3, 16, generator=g)
    k[:, 70] += 20 * q[:, 0].mean(0, keepdim=True)  # the fourth block holds the keys the queries want most
    bias = torch.randn(sum(sizes), generator=g) if with_bias else None
    blocks, start = [], 0
    for n in sizes:
        blocks.append((k[:, start : start + n], v[:, start : start + n]))
        start += n
    want = sdpa(q, k, v, bias)
    torch.testing.assert_close(block_attention.attention(q, blocks, bias), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(block_attention.attention(q, iter(blocks), bias), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(block_attention.attention(q, [(k, v)], bias), want, atol=0, rtol=0)  # plain attention
    # the blocks in reverse order, each key keeping its bias: the same attention (no mask between queries and keys)
    starts = [0, 5, 69, 70]
    rev_bias = None if bias is None else torch.cat([bias[s : s + n] for s, n in zip(starts[::-1], sizes[::-1])])
    torch.testing.assert_close(block_attention.attention(q, blocks[::-1], rev_bias), want, atol=1e-5, rtol=1e-5)


def test_a_blocks_log_sum_exp_is_that_of_its_logits(kernel):
    g = torch.Generator().manual_seed(1)
    qt = torch.randn(1, 2, 5, 8, generator=g)
    k, v = torch.randn(1, 9, 2, 8, generator=g), torch.randn(1, 9, 2, 8, generator=g)
    bias = torch.randn(9, generator=g)
    out, lse = block_attention.partial(qt, k, v, bias)
    logits = qt @ k.transpose(1, 2).transpose(-1, -2) / math.sqrt(8) + bias
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, logits.softmax(-1) @ v.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_float32_logits_are_formed_a_few_queries_at_a_time(monkeypatch):
    """Without the fused kernel a block's logits take at most LOGIT_BYTES: here two of the 7 queries at a time
    over 9 keys, and the result is that of every query at once."""
    g = torch.Generator().manual_seed(2)
    qt = torch.randn(1, 2, 7, 8, generator=g)
    k, v = torch.randn(1, 9, 2, 8, generator=g), torch.randn(1, 9, 2, 8, generator=g)
    bias = torch.randn(9, generator=g)
    monkeypatch.setattr(block_attention, "_FUSED", None)
    whole = block_attention.partial(qt, k, v, bias)
    rows: list[int] = []
    real = torch.logsumexp

    def counting(x, dim):
        rows.append(x.shape[-2])
        return real(x, dim)

    monkeypatch.setattr(block_attention, "LOGIT_BYTES", 4 * 2 * 9 * 2)  # float32, 2 heads, 9 keys, 2 queries
    monkeypatch.setattr(torch, "logsumexp", counting)
    out, lse = block_attention.partial(qt, k, v, bias)
    assert rows == [2, 2, 2, 1]
    torch.testing.assert_close(out, whole[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, whole[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("sizes", [[24], [5, 19]], ids=["one block", "two blocks"])
def test_bfloat16_queries_get_bfloat16_attention_with_the_bias_in_their_dtype(kernel, sizes):
    """A model in bfloat16 attends in bfloat16: the bias is cast to the queries' dtype (SDPA refuses a float32
    mask for bfloat16 queries) and the output comes back in it, near attention in float32."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 2, 16, generator=g)
    k, v = torch.randn(1, sum(sizes), 2, 16, generator=g), torch.randn(1, sum(sizes), 2, 16, generator=g)
    bias = torch.randn(sum(sizes), generator=g)
    blocks, start = [], 0
    for n in sizes:
        blocks.append((k[:, start : start + n].bfloat16(), v[:, start : start + n].bfloat16()))
        start += n
    out = block_attention.attention(q.bfloat16(), blocks, bias)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    torch.testing.assert_close(out.float(), sdpa(q, k, v, bias), atol=0.05, rtol=0.05)


def test_a_cpu_uses_the_fused_kernel(monkeypatch):
    if block_attention._FUSED is None:
        pytest.skip("this torch has no fused CPU attention kernel returning the log-sum-exp")
    calls = []
    fused = block_attention._FUSED

    def counting(*args, **kwargs):
        calls.append(args[1].shape[2])
        return fused(*args, **kwargs)

    monkeypatch.setattr(block_attention, "_FUSED", counting)
    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 10, 2, 8), torch.randn(1, 10, 2, 8)
    block_attention.attention(q, [(k[:, :4], v[:, :4]), (k[:, 4:], v[:, 4:])])
    assert calls == [4, 6]


@pytest.mark.parametrize("keys, budget, steps", [(9, 4 * 2 * 9 * 1, [1] * 7), (1, 4 * 2 * 1 * 2, [2, 2, 2, 1])],
                         ids=["one query a step", "one key"])
def test_the_logits_budget_counts_every_key_of_the_block(monkeypatch, keys, budget, steps):
    g = torch.Generator().manual_seed(4)
    qt = torch.randn(1, 2, 7, 8, generator=g)
    k, v = torch.randn(1, keys, 2, 8, generator=g), torch.randn(1, keys, 2, 8, generator=g)
    monkeypatch.setattr(block_attention, "_FUSED", None)
    whole = block_attention.partial(qt, k, v)
    rows: list[int] = []
    real = torch.logsumexp
    monkeypatch.setattr(block_attention, "LOGIT_BYTES", budget)
    monkeypatch.setattr(torch, "logsumexp", lambda x, dim: rows.append(x.shape[-2]) or real(x, dim))
    out, lse = block_attention.partial(qt, k, v)
    assert rows == steps
    torch.testing.assert_close(out, whole[0], atol=1e-6, rtol=1e-6)


def test_no_block_is_an_error():
    with pytest.raises(ValueError, match=r"^attention needs at least one block of keys$"):
        block_attention.attention(torch.zeros(1, 2, 1, 4), [])


# ----------------------------------------------------------------------------------------- quantized banks
def chunk_kv(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    k = torch.randn(1, L, H, D, generator=g)
    k[..., :3] *= 8.0
    return k, torch.randn(1, L, H, D, generator=g)


def filled(fmt: StorageFormat, chunks: int) -> KVCache:
    cache = KVCache(1, H, D, T, RopeSpec.wan(D))
    cache.use_storage(fmt)
    for i in range(chunks):
        cache.begin_chunk(i, 2 * i, 2)
        k, v = chunk_kv(i)
        cache.attend(0, k, k, v)
        cache.commit_chunk()
    return cache


@pytest.fixture
def decoded_rows(monkeypatch):
    """Rows of each decode a quantized bank makes, in order, with history blocks of 50 rows."""
    seen: list[int] = []
    real = QuantizedBank._decode

    def counting(self, raw_k, raw_v, rows):
        seen.append(raw_k.shape[1])
        return real(self, raw_k, raw_v, rows)

    monkeypatch.setattr(QuantizedBank, "_decode", counting)
    monkeypatch.setattr(quantized_bank, "DECODE_ROWS", 50)
    return seen


@pytest.mark.parametrize("fmt", [KIVI, QVG], ids=["kivi", "qvg"])
def test_a_quantized_bank_attends_one_decoded_block_at_a_time(fmt, decoded_rows, kernel):
    """Attention over 192 history rows decodes blocks of at most 50 rows, every row once, and equals
    attention over the whole decoded history then the chunk (also in a probe that hides rows)."""
    cache = filled(fmt, 6)
    bank = cache.banks[0][0]
    hist_k, hist_v = bank.history()
    cache.begin_chunk(6, 12, 2)
    k, v = chunk_kv(6)
    q = torch.randn(1, L, H, D, generator=torch.Generator().manual_seed(9))
    decoded_rows.clear()
    out = cache.attend(0, q, k, v)
    assert decoded_rows == [50, 50, 50, 42]
    torch.testing.assert_close(out, sdpa(q, torch.cat([hist_k, k], 1), torch.cat([hist_v, v], 1)),
                               atol=1e-5, rtol=1e-5)
    hidden = (torch.arange(192) % 4 == 1) | (torch.arange(192) < 40)
    decoded_rows.clear()
    with cache.probe(hide=lambda b: hidden):
        probed = cache.attend(0, q, k, v)
    assert decoded_rows == [50, 50, 14]  # 152 rows from 40 on, a quarter of them hidden
    seen = ~hidden
    torch.testing.assert_close(probed, sdpa(q, torch.cat([hist_k[:, seen], k], 1), torch.cat([hist_v[:, seen], v], 1)),
                               atol=1e-5, rtol=1e-5)


def test_a_shared_fork_decodes_blocks_across_the_rows_it_shares(decoded_rows):
    """A fork reads its parent's 96 rows in place and owns the rest: a block straddling the two equals the
    rows of a fork that copied everything."""
    cache = filled(KIVI, 3)
    shared, copied = cache.fork(headroom=4 * L), cache.fork(headroom=4 * L, share=False)
    outs = []
    for fork in (shared, copied):
        for i in (3, 4, 5):  # chunk 5 left open: its slot is read after the history
            fork.begin_chunk(i, 2 * i, 2)
            k, v = chunk_kv(i)
            out = fork.attend(0, k.flip(1), k, v)
            if i < 5:
                fork.commit_chunk()
        outs.append(out)
    bank = shared.banks[0][0]
    assert bank.base == 96 and bank.n == 160
    for block in (50, 7):
        parts = list(bank.blocks(L, block=block))
        whole = list(copied.banks[0][0].blocks(L, block=block))
        assert [p[0].shape[1] for p in parts] == [p[0].shape[1] for p in whole]
        for (a_k, a_v), (b_k, b_v) in zip(parts, whole):
            assert torch.equal(a_k, b_k) and torch.equal(a_v, b_v)
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_recorded_attention_of_a_quantized_bank_reads_one_block_at_a_time(decoded_rows):
    """Attention statistics over a quantized history (DummyForcing's head map records them) read the blocks
    twice more, never the history at once, and give the mass of the softmax over every decoded key: in full,
    over chosen key frames, and in a probe that hides rows."""
    cache = filled(KIVI, 6)
    hist_k, _ = cache.banks[0][0].history()
    history_frames = cache.banks[0][0].field("frame")
    cache.begin_chunk(6, 12, 2)
    k, v = chunk_kv(6)
    q = torch.randn(1, L, H, D, generator=torch.Generator().manual_seed(9))
    keys, frames = torch.cat([hist_k, k], 1), torch.cat([history_frames, torch.arange(12, 14).repeat_interleave(T)])
    decoded_rows.clear()
    with cache.record_attention() as stats:
        out = cache.attend(0, q, k, v)
    assert decoded_rows == [50, 50, 50, 42] * 3  # the normaliser, the mass, the attention
    torch.testing.assert_close(stats.mass[0], frame_mass(q, keys, frames, 14), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, sdpa(q, keys, torch.cat([cache.banks[0][0].history()[1], v], 1)),
                               atol=1e-5, rtol=1e-5)
    hidden = (torch.arange(192) % 4 == 1) | (torch.arange(192) < 40)
    seen = torch.cat([~hidden, torch.ones(L, dtype=torch.bool)])
    chosen = seen & torch.isin(frames, torch.tensor([3, 5, 12, 13]))
    with cache.probe(hide=lambda b: hidden), cache.record_attention(key_frames=(3, 5, 12, 13)) as stats:
        cache.attend(0, q, k, v)
    torch.testing.assert_close(stats.mass[0], frame_mass(q, keys[:, chosen], frames[chosen], 14), atol=1e-6, rtol=1e-5)
    assert stats.mass[0][:, 4].eq(0).all() and stats.mass[0][:, 3].gt(0).all()


@pytest.mark.parametrize("fmt, rows", [(KIVI, [64] * 3), (QVG, [64] * 3)], ids=["kivi", "qvg"])
def test_a_quantized_re_index_decodes_a_block_at_a_time_and_fits_each_entry_whole(fmt, rows, decoded_rows, monkeypatch):
    """The re-index decodes, rotates and encodes about DECODE_ROWS rows at a time, cut only between table
    entries (KIVI's per frame and key group, 16 rows here; QVG's per chunk, 32): the stored codes, the key
    table and the recent window equal those of a re-index in one block, bit for bit, and with a block of 7
    rows (never cutting an entry) too."""
    caches = [filled(fmt, 6) for _ in range(3)]
    entry = fmt.codecs()[0].entry_rows(T, L)  # the bound `plan` states: a span is under DECODE_ROWS + entry rows
    assert entry == (16 if fmt is KIVI else 32)
    decoded_rows.clear()
    caches[0].reindex(12, 2, 5.0)
    assert decoded_rows == rows and max(rows) <= 50 + entry - 1
    monkeypatch.setattr(quantized_bank, "DECODE_ROWS", 7)
    decoded_rows.clear()
    caches[1].reindex(12, 2, 5.0)
    assert decoded_rows == [16] * 12 if fmt is KIVI else [32] * 6
    monkeypatch.setattr(quantized_bank, "DECODE_ROWS", 64)  # a span ends at the first cut at or past the block
    cache = filled(fmt, 6)
    decoded_rows.clear()
    cache.reindex(12, 2, 5.0)
    assert decoded_rows == [64] * 3
    monkeypatch.setattr(quantized_bank, "DECODE_ROWS", 10**6)
    decoded_rows.clear()
    caches[2].reindex(12, 2, 5.0)
    assert decoded_rows == [192]
    whole = caches[2].banks[0][0]
    assert not torch.equal(whole.storage()[0][:, :192], filled(fmt, 6).banks[0][0].storage()[0][:, :192])  # keys moved
    for cache in caches[:2]:
        bank = cache.banks[0][0]
        for mine, theirs in zip(bank.storage(), whole.storage()):
            assert torch.equal(mine[:, :192], theirs[:, :192])
        for mine, theirs in zip(bank.tables, whole.tables):
            assert torch.equal(mine.keys, theirs.keys)
            assert (mine.data is None) == (theirs.data is None)
            assert mine.data is None or torch.equal(mine.data, theirs.data)
        if fmt.residual:
            assert torch.equal(bank.tail_gid, whole.tail_gid) and torch.equal(bank.tail[0], whole.tail[0])
        assert torch.equal(bank.history()[0], whole.history()[0])


@pytest.mark.parametrize("fmt", [KIVI, QVG], ids=["kivi", "qvg"])
def test_re_index_statistics_and_attention_hold_a_block_not_the_history(fmt, monkeypatch):
    """Memory, counted by the KV-bytes benchmark's CPU meter (allocator events, deterministic): over a
    768-row history, a re-index, a call recording attention statistics and a plain call each hold, beyond
    what was held before, under a quarter of what they hold when the history is one block (measured: about
    a tenth with 50-row blocks)."""
    transient = {}
    for rows in (10**6, 50):
        monkeypatch.setattr(quantized_bank, "DECODE_ROWS", rows)
        cache = filled(fmt, 24)
        meter = CpuMeter()
        with meter.session():
            with meter.window("re-index"):
                cache.reindex(48, 2, 5.0)
            cache.begin_chunk(24, 48, 2)
            k, v = chunk_kv(24)
            with meter.window("statistics"), cache.record_attention():
                cache.attend(0, k, k, v)
            with meter.window("attention"):
                cache.attend(0, k, k, v)
        transient[rows] = {key: peak - start for key, (start, peak) in meter.peaks.items()}
    for key, whole in transient[10**6].items():
        assert whole > 768 * H * D * 4  # one block decodes at least the history's keys in float32
        assert transient[50][key] < whole / 4, key


# ----------------------------------------------------------------------------------------- fused kernels
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's fused kernels need a CUDA device "
                          "(scripts/gpu_check.py runs these equalities on a GPU)")


@pytest.mark.parametrize("device, dtype, head_dim, biased, want", [
    ("cpu", torch.float32, 16, True, "cpu"),
    ("cuda", torch.bfloat16, 128, False, "flash"),
    ("cuda", torch.float16, 64, False, "flash"),
    ("cuda", torch.bfloat16, 128, True, "efficient"),
    ("cuda", torch.float32, 128, False, "efficient"),
    ("cuda", torch.bfloat16, 512, False, "efficient"),
    ("cuda", torch.bfloat16, 256, False, "flash"),  # flash attention's largest head dim, taken
    ("cuda", torch.bfloat16, 264, False, "efficient"),  # the next multiple of 8, not
    ("cuda", torch.bfloat16, 12, False, "logits"),
    ("cuda", torch.float64, 128, False, "logits"),
    ("mps", torch.float32, 128, False, "logits"),
])
def test_each_block_takes_the_first_fused_kernel_that_accepts_it(device, dtype, head_dim, biased, want):
    if want == "cpu" and block_attention._FUSED is None:
        pytest.skip("this torch has no fused CPU attention kernel returning the log-sum-exp")
    assert block_attention.kernel(torch.device(device), dtype, head_dim, biased) == want


def test_without_cuda_kernels_a_gpu_block_forms_float32_logits(monkeypatch):
    monkeypatch.setattr(block_attention, "_FLASH", None)
    assert block_attention.kernel(torch.device("cuda"), torch.bfloat16, 128, False) == "efficient"
    monkeypatch.setattr(block_attention, "_EFFICIENT", None)
    assert block_attention.kernel(torch.device("cuda"), torch.bfloat16, 128, False) == "logits"


@pytest.mark.parametrize("n", [1, 16, 37])
def test_the_efficient_kernels_bias_is_one_padded_row_in_the_queries_dtype(n):
    qt = torch.zeros(2, 3, 5, 8, dtype=torch.bfloat16)
    bias = torch.randn(n)
    mask = block_attention.aligned_bias(bias, qt, n)
    assert mask.shape == (2, 3, 5, n) and mask.dtype == torch.bfloat16
    assert mask.untyped_storage().nbytes() == -(-n // 16) * 16 * 2
    torch.testing.assert_close(mask[1, 2, 4], bias.bfloat16(), atol=0, rtol=0)


def test_the_efficient_kernels_padded_log_sum_exp_is_cut_to_the_queries(monkeypatch):
    """CUDA's memory-efficient kernel pads its log-sum-exp's query rows to a multiple of 32: the host code of
    that branch, run here against a stand-in kernel that pads with garbage, keeps the real rows only."""
    def stand_in(qt, kt, vt, mask, compute_lse):
        assert compute_lse and mask.untyped_storage().nbytes() % (16 * mask.element_size()) == 0
        logits = qt @ kt.transpose(-1, -2) / math.sqrt(qt.shape[-1]) + mask
        lse = torch.logsumexp(logits, -1)
        padded = torch.full((*lse.shape[:2], 32), float("nan"))
        padded[:, :, : lse.shape[2]] = lse
        return logits.softmax(-1) @ vt, padded, None, None

    monkeypatch.setattr(block_attention, "kernel", lambda *args: "efficient")
    monkeypatch.setattr(block_attention, "_EFFICIENT", stand_in)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 7, 2, 8, generator=g)
    k, v = torch.randn(1, 30, 2, 8, generator=g), torch.randn(1, 30, 2, 8, generator=g)
    bias = torch.randn(30, generator=g)
    out, lse = block_attention.partial(q.transpose(1, 2), k[:, :19], v[:, :19], bias[:19])
    assert lse.shape == (1, 2, 7) and bool(torch.isfinite(lse).all())
    got = block_attention.attention(q, [(k[:, :19], v[:, :19]), (k[:, 19:], v[:, 19:])], bias)
    torch.testing.assert_close(got, sdpa(q, k, v, bias), atol=1e-5, rtol=1e-5)


def test_the_flash_kernels_output_and_log_sum_exp_combine_blocks(monkeypatch):
    """The host code of CUDA's flash branch, against a stand-in returning what the kernel returns (output and
    log-sum-exp first, then its bookkeeping): the blocks combine into attention over every key."""
    calls = []

    def stand_in(qt, kt, vt):
        calls.append(kt.shape[2])
        logits = qt @ kt.transpose(-1, -2) / math.sqrt(qt.shape[-1])
        return logits.softmax(-1) @ vt, torch.logsumexp(logits, -1), None, None, 0, 0, None, None, None

    monkeypatch.setattr(block_attention, "kernel", lambda *args: "flash")
    monkeypatch.setattr(block_attention, "_FLASH", stand_in)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 7, 2, 8, generator=g) * 2
    k, v = torch.randn(1, 30, 2, 8, generator=g) * 2, torch.randn(1, 30, 2, 8, generator=g)
    got = block_attention.attention(q, [(k[:, :11], v[:, :11]), (k[:, 11:], v[:, 11:])])
    assert calls == [11, 19]
    torch.testing.assert_close(got, sdpa(q, k, v), atol=1e-5, rtol=1e-5)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
def test_cuda_blocks_take_a_fused_kernel_and_equal_one_sdpa_call(monkeypatch, dtype, with_bias):
    used = []
    for name in ("_FLASH", "_EFFICIENT"):
        real = getattr(block_attention, name)
        monkeypatch.setattr(block_attention, name, lambda *a, _real=real, _name=name, **kw: used.append(_name)
                            or _real(*a, **kw))
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 45, 3, 64, generator=g)
    k, v = torch.randn(2, 300, 3, 64, generator=g), torch.randn(2, 300, 3, 64, generator=g)
    bias = torch.randn(300, generator=g) if with_bias else None
    sizes = [37, 200, 63]
    cuda = [t.cuda().to(dtype) for t in (q, k, v)]
    blocks, start = [], 0
    for n in sizes:
        blocks.append((cuda[1][:, start : start + n], cuda[2][:, start : start + n]))
        start += n
    got = block_attention.attention(cuda[0], blocks, None if bias is None else bias.cuda())
    want = sdpa(*(t.cuda() for t in (q, k, v)), None if bias is None else bias.cuda())
    assert used == ["_FLASH" if dtype == torch.bfloat16 and not with_bias else "_EFFICIENT"] * len(sizes)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
