"""Transient memory of the model calls (activations), estimated from the shapes.

Unlike weights and the KV cache these are not replayed tensor by tensor: the coefficients below were
measured with :class:`~cmbench.backbones.memory.measure.PeakMemory` on the CPU (random weights, the
real widths, shorter token grids and frames; ``tests/test_memory_plan.py`` re-measures the DiT's at a
small width and the VAE's at 64x112) and scale with the token and pixel counts. On a GPU the kernels differ (fused attention, cuDNN
workspaces); ``scripts/gpu_check.py`` compares the whole plan with ``torch.cuda.max_memory_allocated``.
Next to the KV cache of a one-minute context they are a few percent of the peak.
"""

from __future__ import annotations

# one DiT block on L tokens (dim d, FFN width f, compute dtype of c bytes): L * c * (FFN_COEF * f + DIM_COEF * d),
# the camera embedding carried through the blocks included
FFN_COEF = 1.4
DIM_COEF = 12.5
CAMERA_EMBED_DIM_COEF = 4.0  # the camera embedding's own stage: its folded input + ~4 [L, d] tensors
# the Wan 2.1 VAE (float32, base width 96), per pixel of one frame: encoding works on 4 frames at a time with
# its causal caches; decoding keeps the decoder's caches and one frame's activations. Other widths and dtypes
# scale them (``vae_scale``: dtype bytes / 4 x base width / 96).
VAE_ENCODE_PER_PIXEL = 14_300
VAE_DECODE_PER_PIXEL = 29_200
VAE_BASE_DIM = 96
BLOCK_FLOAT_OUTPUTS = 4  # block-wise attention: running output, a block's output, their two rescaled terms
SCORER_WORKSPACE_BYTES = 2 * 2**30  # detector / segmenter / embedder on a batch of frames (an allowance)


def dit_call(tokens: int, dim: int, ffn_dim: int, compute_bytes: int, text_len: int = 0, text_dim: int = 0,
             camera_values: int = 0, sequence: int = 1) -> int:
    """Peak activation bytes of one DiT call on ``tokens`` tokens (the KV cache not included).

    The call holds its inputs (the camera map copied into the compute dtype: ``camera_values`` channels
    per token, LingBot 384 x 2 x 2; the text states, their embedding and the cross-attention K and V),
    and its peak is the larger of two stages: the camera embedding (a folded copy of the map) and a block.
    With ``sequence`` ranks per model (Ulysses) a rank's blocks run ``tokens / sequence`` tokens (the
    all-to-alls move as many values as a block's q, k, v); the inputs and the camera embedding stay whole.
    """
    c = compute_bytes
    inputs = tokens * camera_values * c + text_len * (text_dim + 3 * dim) * c
    block = tokens // sequence * c * (FFN_COEF * ffn_dim + DIM_COEF * dim)
    camera = tokens * c * (camera_values + CAMERA_EMBED_DIM_COEF * dim) if camera_values else 0
    return int(inputs + max(block, camera))


def attention_call(queries: int, history: int, heads: int, head_dim: int, compute_bytes: int, device: str,
                   decode_rows: int = 0, joined: bool = False) -> int:
    """Bytes one attention call (:meth:`~cmbench.cache.kv_cache.KVCache.attend`) holds for a moment beyond what
    it is given and what it returns.

    Parameters
    ----------
    queries, history : int
        The chunk's tokens (its queries and its own keys) and the history tokens read before them.
    heads, head_dim, compute_bytes : int
    device : {"cpu", "cuda"}
        Whose kernels: the CPU's fused flash attention keeps a block of logits and accumulators per thread
        (:func:`cpu_kernel`); CUDA's flash and memory-efficient kernels keep none in the allocator
        (``scripts/gpu_check.py`` measures it).
    decode_rows : int
        0: the history in full precision, attended in one fused call. Otherwise a quantized history decoded
        ``decode_rows`` rows at a time (:func:`~cmbench.cache.block_attention.attention`): two decoded blocks
        alive, and the running output, a block's output and their rescaled sums in float32.
    joined : bool
        A fork reading the prefilled cache's rows in place: a full-precision history is joined to the chunk's
        rows (one copy of both, K and V) for the one fused call.
    """
    lse = queries * heads * 4
    row = heads * head_dim * compute_bytes  # one key's K or V
    if not decode_rows or not history:  # one fused call over the history and the chunk
        kernel = cpu_kernel(queries, history + queries, head_dim, compute_bytes) if device == "cpu" else 0
        return lse + kernel + (2 * (history + queries) * row if joined and history else 0)
    rows = min(decode_rows, history)
    kernel = cpu_kernel(queries, max(rows, queries), head_dim, compute_bytes) if device == "cpu" else 0
    return 2 * 2 * rows * row + BLOCK_FLOAT_OUTPUTS * queries * heads * head_dim * 4 + 3 * lse + kernel


def cpu_kernel(queries: int, keys: int, head_dim: int, compute_bytes: int, threads: int | None = None) -> int:
    """The buffer torch's CPU flash attention allocates for one call: per thread, a block of float32 logits
    (``q`` queries by up to 512 keys; ``q`` 256, 64 or 32 as there are at least 768, 192 or fewer queries), a
    copy of it in the compute dtype when that is not float32, the block's float32 output and two statistics
    per query."""
    import torch

    q = 256 if queries >= 768 else 64 if queries >= 192 else 32
    kv = min(512, keys)
    reduced = compute_bytes if compute_bytes != 4 else 0
    per_thread = q * kv * (4 + reduced) + q * head_dim * 4 + 2 * q * 4
    return per_thread * (torch.get_num_threads() if threads is None else threads)


def vae_scale(dtype_bytes: int, base_dim: int = VAE_BASE_DIM) -> float:
    """How a VAE's workspace compares with the float32 Wan 2.1 VAE's."""
    return dtype_bytes / 4 * base_dim / VAE_BASE_DIM


def vae_encode(pixel_frames: int, height: int, width: int, scale: float = 1.0) -> int:
    """Encoding ``pixel_frames`` frames: the video on the device (uint8, then one float copy) + the encoder."""
    pixels = height * width
    video = pixel_frames * 3 * pixels * (1 + 4)
    return video + int(VAE_ENCODE_PER_PIXEL * pixels * scale)


def vae_first_frame(pixel_frames: int, height: int, width: int, scale: float = 1.0) -> int:
    """LingBot's I2V latents: a float video of ``pixel_frames`` frames (first frame, zeros) + the encoder."""
    pixels = height * width
    return pixel_frames * 3 * pixels * 4 + int(VAE_ENCODE_PER_PIXEL * pixels * scale)


def vae_decode(latent_frames: int, height: int, width: int, scale: float = 1.0, stride: int = 4) -> int:
    """Decoding a continuation after its context: the decoder's state and work + the kept frames (float)."""
    pixels = height * width
    kept = latent_frames * stride * 3 * pixels * 4 * 2  # the decoded frames, then their concatenation
    return kept + int(VAE_DECODE_PER_PIXEL * pixels * scale)


def text_call(text_len: int, d_model: int, d_ff: int, heads: int, compute_bytes: int) -> int:
    """One prompt through the umt5 encoder: a few hidden states, one FFN, one layer's float32 attention scores."""
    return text_len * (8 * d_model + 3 * d_ff) * compute_bytes + heads * text_len * text_len * 4
