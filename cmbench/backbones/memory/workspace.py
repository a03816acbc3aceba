"""Transient memory of the model calls (activations), estimated from the shapes.

Unlike weights and the KV cache these are not replayed tensor by tensor: the coefficients below were
measured with :class:`~cmbench.backbones.memory.measure.PeakMemory` on the CPU (random weights, the
real widths, shorter token grids; ``tests/test_memory_plan.py`` re-measures the DiT one at a small
width) and scale with the token and pixel counts. On a GPU the kernels differ (fused attention, cuDNN
workspaces); ``scripts/gpu_check.py`` compares the whole plan with ``torch.cuda.max_memory_allocated``.
Next to the KV cache of a one-minute context they are a few percent of the peak.
"""

from __future__ import annotations

# one DiT call on L tokens (dim d, FFN width f, compute dtype of c bytes): L * (FFN_COEF * c * f + DIM_COEF * c * d)
# plus the text states (text_len x (text_dim + 3 d), input, embedding, cross-attention K and V)
FFN_COEF = 1.35
DIM_COEF = 12.0
# the Wan 2.1 VAE (float32), per pixel of one frame: encoding works on 4 frames at a time with its causal
# caches; decoding keeps the decoder's caches and one frame's activations
VAE_ENCODE_PER_PIXEL = 14_300
VAE_DECODE_PER_PIXEL = 29_200
TEXT_FORWARD_BYTES = 300 * 2**20  # umt5-xxl on 512 tokens (hidden states, one layer's attention scores)
SCORER_WORKSPACE_BYTES = 2 * 2**30  # detector / segmenter / embedder on a batch of frames (an allowance)


def dit_call(tokens: int, dim: int, ffn_dim: int, compute_bytes: int, text_len: int = 0, text_dim: int = 0,
             camera_values: int = 0) -> int:
    """Peak activation bytes of one DiT call on ``tokens`` tokens (the KV cache not included).

    ``camera_values``: camera channels per token (LingBot: 384 x 2 x 2), whose map each call copies into
    the compute dtype.
    """
    body = tokens * (FFN_COEF * compute_bytes * ffn_dim + DIM_COEF * compute_bytes * dim)
    return int(body + text_len * (text_dim + 3 * dim) * compute_bytes + tokens * camera_values * compute_bytes)


def vae_encode(pixel_frames: int, height: int, width: int, vae_bytes_per_value: int = 4) -> int:
    """Encoding ``pixel_frames`` frames: the video on the device (uint8, then one float copy) + the encoder."""
    pixels = height * width
    video = pixel_frames * 3 * pixels * (1 + 4)
    return video + int(VAE_ENCODE_PER_PIXEL * pixels * vae_bytes_per_value / 4)


def vae_first_frame(pixel_frames: int, height: int, width: int, vae_bytes_per_value: int = 4) -> int:
    """LingBot's I2V latents: a float video of ``pixel_frames`` frames (first frame, zeros) + the encoder."""
    pixels = height * width
    return pixel_frames * 3 * pixels * 4 + int(VAE_ENCODE_PER_PIXEL * pixels * vae_bytes_per_value / 4)


def vae_decode(latent_frames: int, height: int, width: int, vae_bytes_per_value: int = 4, stride: int = 4) -> int:
    """Decoding a continuation after its context: the decoder's state and work + the kept frames (float)."""
    pixels = height * width
    kept = latent_frames * stride * 3 * pixels * 4 * 2  # the decoded frames, then their clamped copy
    return kept + int(VAE_DECODE_PER_PIXEL * pixels * vae_bytes_per_value / 4)
