"""LingBot World's image-to-video conditioning: a mask and the first frame's latents.

The DiT reads 36 channels per latent pixel: the 16 noisy latent channels, then ``y`` = 4 mask
channels + 16 latent channels (Wan 2.2 I2V layout). ``y``'s latents are the VAE encoding of the
timeline's pixel video with the first frame kept and every later frame zero (mid-grey in [-1, 1]);
the mask is 1 on the 4 mask channels of latent frame 0 (the 4 pixel frames a latent frame stands
for, of which only the first is given) and 0 elsewhere.

In CMBench the first frame is the first frame of the prepared context video. The VAE is causal, so the
encoding of a longer zero-padded video extends that of a shorter one exactly;
:class:`FirstFrameLatents` encodes lazily, doubling its length when a chunk asks for frames beyond
what it holds (one encode per context in the usual case, where the first request covers the context
plus 16 continuation frames).
"""

from __future__ import annotations

import numpy as np
import torch

MIN_FRAMES = 8


class FirstFrameLatents:
    """The I2V channels ``y`` of every latent frame of a timeline.

    Parameters
    ----------
    vae : WanVAE
    first_frame : ndarray, ``uint8 [H, W, 3]``
        The conditioning image at the backbone's frame size.
    expected_frames : int
        Latent frames to encode on first use (e.g. context + continuation); more are added on demand.
    """

    def __init__(self, vae, first_frame: np.ndarray, expected_frames: int = MIN_FRAMES) -> None:
        self.vae = vae
        self.first = torch.as_tensor(np.ascontiguousarray(first_frame))
        if self.first.dim() != 3 or self.first.shape[-1] != 3:
            raise ValueError(f"first frame must be uint8 [H, W, 3], got {tuple(self.first.shape)}")
        self.expected = max(int(expected_frames), MIN_FRAMES)
        self.latents: torch.Tensor | None = None  # [1, z, n, h, w]
        self.encodes = 0

    @property
    def mask_channels(self) -> int:
        return self.vae.temporal_stride

    def _ensure(self, frames: int) -> torch.Tensor:
        """The encoded latents ``[1, z, n, h, w]``, encoding more frames when fewer than ``frames``."""
        have = 0 if self.latents is None else self.latents.shape[2]
        if self.latents is not None and frames <= have:
            return self.latents
        n = max(frames, 2 * have, self.expected)
        stride = self.vae.temporal_stride
        h, w = self.first.shape[:2]
        pixels = torch.zeros(1, 3, 1 + stride * (n - 1), h, w, device=self.vae.device)
        pixels[0, :, 0] = self.first.to(self.vae.device).permute(2, 0, 1).float().div(127.5).sub(1.0)
        latents = self.vae.encode_pixels(pixels)
        self.latents = latents
        self.encodes += 1
        return latents

    def channels(self, frame_start: int, frames: int) -> torch.Tensor:
        """Mask and latent channels of latent frames ``frame_start .. frame_start + frames - 1``.

        Returns
        -------
        Tensor, shape ``[1, mask_channels + z_dim, frames, h, w]``, float32 on the VAE's device.
        """
        lat = self._ensure(frame_start + frames)[:, :, frame_start : frame_start + frames]
        mask = torch.zeros(1, self.mask_channels, frames, *lat.shape[3:], device=lat.device)
        if frame_start == 0:
            mask[:, :, 0] = 1.0
        return torch.cat([mask, lat], dim=1)
