"""The KV cache's precision (``cache.dtype``): rows stored in bfloat16 whatever the model computes in, FullKV's
bytes counted in that precision, a quantized format's bytes against a bfloat16 FullKV, the precision in
every record and config hash, and a calibration keyed by it."""

from __future__ import annotations

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.cache.ledger import fp_bytes_per_head_token
from cmbench.cache.quantized import StorageFormat
from cmbench.errors import ConfigError
from cmbench.generation import GenerationSettings, continue_task, prefill
from cmbench.methods.fullkv import FullKV
from cmbench.runs.records import TaskRecord, record_cache_dtype
from cmbench.spec import cache_dtype_spec, result_config
from fakes import AttentionBackbone, fake_geometry

G = fake_geometry(num_layers=2, num_heads=4, head_dim=12)


def _run(settings: GenerationSettings, chunks: int = 4):
    backbone = AttentionBackbone(G, seed=0)
    ctx = torch.randn(1, G.latent_channels, 3 * G.chunk_frames, G.latent_height, G.latent_width,
                      generator=torch.Generator().manual_seed(6))
    pre = prefill(backbone, FullKV(), ctx, None, seed=0, settings=settings)
    return pre, continue_task(backbone, pre, None, chunks * G.chunk_frames, seed=1)


def test_a_bfloat16_cache_stores_its_rows_in_bfloat16_and_counts_fullkv_in_it():
    pre, cont = _run(GenerationSettings(cache_dtype="bfloat16"))
    bank = cont.cache.banks[0][0]
    assert bank.k.dtype == bank.v.dtype == torch.bfloat16
    assert cont.cache.row_dtype == torch.bfloat16
    heads = G.num_layers * G.num_heads
    per = 2 * G.head_dim * 2  # K and V of one head-token, 2 bytes each: FullKV in bfloat16
    ledger = cont.ledger
    assert [e.full_bytes for e in ledger.entries] == [e.full * heads * per for e in ledger.entries]
    assert ledger.kv_bytes_ratio() == 1.0
    assert cont.latents.dtype == torch.float32  # the model still computes in its own precision
    _, fp = _run(GenerationSettings())
    assert fp.cache.row_dtype == torch.float32 and fp.ledger.peak_full_bytes == 2 * ledger.peak_full_bytes


def test_attention_reads_bfloat16_rows_back_in_the_queries_precision():
    """One call over a bfloat16 history equals float32 attention over the keys and values rounded to bfloat16."""
    cache = KVCache.from_geometry(G)
    cache.store_in(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    qkv = [[torch.randn(1, G.tokens_per_chunk, G.num_heads, G.head_dim, generator=g) for _ in range(3)]
           for _ in range(2)]
    for chunk, (q, k, v) in enumerate(qkv):
        cache.begin_chunk(chunk, chunk * G.chunk_frames, G.chunk_frames)
        for layer in range(G.num_layers):
            out = cache.attend(layer, q, k, v)
        cache.commit_chunk()
    q, k, v = qkv[1]
    keys = torch.cat([qkv[0][1], k], dim=1).to(torch.bfloat16).float()
    values = torch.cat([qkv[0][2], v], dim=1).to(torch.bfloat16).float()
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)).transpose(1, 2)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_kivi4_stores_about_0_31_of_a_bfloat16_fullkv_at_head_dim_128():
    """By hand, per head-token over a long history at head dim 128, KIVI-4 with groups of 32: keys 64 bytes of
    codes plus a float16 scale and zero point per channel per 32 token positions (128 * 4 / 32 = 16 bytes);
    values 64 bytes of codes plus a scale and zero point per 32 channels (4 * 4 = 16 bytes): 160 bytes, against
    FullKV's 2 * 128 * 2 = 512 in bfloat16 (0.3125) or 1024 in float32 (0.156). Measured on a cache of 2 heads
    holding 32 frames of 32 tokens, no recent window (its rows are in the cache's precision)."""
    geometry = fake_geometry(num_layers=1, num_heads=2, head_dim=128, height=8, width=16, chunk_frames=1)
    T, frames = geometry.tokens_per_frame, 32
    assert T == 32
    ratio = {}
    for dtype in (torch.bfloat16, torch.float32):
        cache = KVCache.from_geometry(geometry, compute_attention=False)
        cache.use_storage(StorageFormat(name="kivi", bits=4, group_size=32, residual=0))
        cache.store_in(dtype)
        g = torch.Generator().manual_seed(1)
        for chunk in range(frames):
            cache.begin_chunk(chunk, chunk, 1)
            x = torch.randn(1, T, 2, 128, generator=g)
            cache.attend(0, x, x, x)
            cache.commit_chunk()
        ratio[dtype] = cache.stored_bytes() / (2 * frames * T * fp_bytes_per_head_token(cache))
    assert ratio[torch.bfloat16] == pytest.approx(160 / 512, rel=1e-3)  # 0.3125
    assert ratio[torch.float32] == pytest.approx(160 / 1024, rel=1e-3)


def test_the_cache_precision_is_chosen_before_the_first_chunk_and_is_a_float():
    cache = KVCache.from_geometry(G)
    with pytest.raises(ValueError, match="floating-point"):
        cache.store_in(torch.int8)
    cache.begin_chunk(0, 0, G.chunk_frames)
    with pytest.raises(RuntimeError, match="before the first chunk"):
        cache.store_in(torch.bfloat16)


def test_cache_dtype_config_is_checked_and_hashed_only_when_set():
    assert cache_dtype_spec(None) is None and cache_dtype_spec({"dtype": None}) is None
    assert cache_dtype_spec({"dtype": "bfloat16"}) == "bfloat16"
    with pytest.raises(ConfigError, match=r"cache.dtype='int8': expected one of bfloat16, float16, float32"):
        cache_dtype_spec({"dtype": "int8"})
    with pytest.raises(ConfigError, match="cache=3: expected a block with dtype"):
        cache_dtype_spec(3)
    plain = {"seed": 2, "generation": {"x": 1}}
    assert "cache" not in result_config({**plain, "cache": {"dtype": None}})  # hashes as before the key existed
    assert result_config({**plain, "cache": {"dtype": "bfloat16"}})["cache"] == {"dtype": "bfloat16"}


def test_a_record_names_its_cache_precision_and_one_without_is_float32():
    ok = {"task_id": "t", "status": "ok"}
    assert record_cache_dtype(TaskRecord.from_json({**ok, "schema_version": 5})) == "float32"
    assert record_cache_dtype({"task_id": "t"}) == "float32"
    assert record_cache_dtype(TaskRecord.from_json({**ok, "cache_dtype": "bfloat16"})) == "bfloat16"
    with pytest.raises(ValueError, match="cache_dtype: is 'fp8', expected one of bfloat16, float16, float32"):
        TaskRecord.from_json({**ok, "cache_dtype": "fp8"})
