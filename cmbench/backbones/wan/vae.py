"""The Wan 2.1 VAE through diffusers' ``AutoencoderKLWan``: pixels <-> normalised latents.

Wan's latents are the posterior mean, normalised per channel with the VAE config's
``latents_mean`` / ``latents_std``: ``z = (mu - mean) / std``. The VAE is causal in time with stride 4:
``4 k + 1`` pixel frames give ``k + 1`` latent frames (the first latent frame sees the first pixel
frame alone), and ``F'`` latent frames decode to ``1 + 4 (F' - 1)`` pixel frames. Spatial stride 8.

:meth:`WanVAE.encode` first repeats the last frame up to the next ``4 k + 1`` frames, so ``F`` pixel
frames give ``(F + 2 * 4 - 2) // 4`` latent frames: the count of the authors' runtime
(:func:`cmbench.data.video.latent_frame_count`) that context preparation pads to whole chunks.

A continuation is decoded as the authors do (they decode the context and the continuation as one
causal timeline and keep the continuation's 4 frames per latent frame):
:meth:`WanVAE.decode_continuation` runs the causal decoder over the context's latent frames first,
discarding their pixels but keeping its per-layer caches, then decodes the continuation from that
state, so 16 latent frames give 64 frames, the same frames a decode of the whole timeline gives for
them. The decoder state after a context is computed once and reused by every task of that context.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch

from cmbench.backbones.wan.precision import parse_dtype
from cmbench.errors import ConfigError


class WanVAE:
    """Encode and decode videos with a diffusers ``AutoencoderKLWan``.

    Parameters
    ----------
    model : diffusers.AutoencoderKLWan
    device : str
    dtype : torch.dtype
        Compute dtype of the VAE (float32 by default, as Wan).
    """

    def __init__(self, model, device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if next(model.parameters()).dtype != dtype:
            model = model.to(dtype=dtype)
        self.model = model.to(device).eval().requires_grad_(False)
        self.device = torch.device(device)
        self.dtype = dtype
        cfg = model.config
        self.z_dim = int(cfg.z_dim)
        self.temporal_stride = int(getattr(cfg, "scale_factor_temporal", 4))
        self.spatial_stride = int(getattr(cfg, "scale_factor_spatial", 8))
        if cfg.latents_mean is None or cfg.latents_std is None:
            raise ConfigError("the Wan VAE config needs latents_mean and latents_std (Wan's latent normalisation)")
        self.mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(cfg.latents_std, dtype=torch.float32).view(1, -1, 1, 1, 1)
        self._context_state: tuple | None = None  # (weakref to context latents, version, warmup, decoder caches)
        if self.mean.shape[1] != self.z_dim or self.std.shape[1] != self.z_dim:
            raise ConfigError(f"latents_mean/std have {self.mean.shape[1]}/{self.std.shape[1]} entries, "
                              f"z_dim is {self.z_dim}")

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", dtype: str | torch.dtype = "float32") -> "WanVAE":
        """Load a diffusers-format VAE folder (``config.json`` + ``diffusion_pytorch_model.safetensors``).

        For the real model: the ``vae/`` folder of ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` (the same weights
        as ``Wan2.1_VAE.pth``).
        """
        from diffusers import AutoencoderKLWan

        path = Path(path).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"Wan VAE not found: {path} has no config.json (expected a diffusers AutoencoderKLWan "
                              f"folder, e.g. the vae/ folder of Wan-AI/Wan2.1-T2V-1.3B-Diffusers)")
        dtype = parse_dtype(dtype)
        model = AutoencoderKLWan.from_pretrained(str(path), local_files_only=True, torch_dtype=dtype,
                                                 low_cpu_mem_usage=False)
        return cls(model, device, dtype)

    def latent_frames(self, pixel_frames: int) -> int:
        """Latent frames :meth:`encode` gives for ``F`` pixel frames: ``1 + ceil((F - 1) / stride)``."""
        return 1 + -(-(pixel_frames - 1) // self.temporal_stride)

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalised latents of a video in [-1, 1].

        Parameters
        ----------
        pixels : Tensor, shape ``[1, 3, F, H, W]``, values in [-1, 1]

        Returns
        -------
        Tensor, shape ``[1, z_dim, 1 + (F - 1) // 4, H / 8, W / 8]``, float32 on the VAE's device.
        """
        mu = self.model.encode(pixels.to(self.device, self.dtype)).latent_dist.mode().float()
        return (mu - self.mean.to(mu.device)) / self.std.to(mu.device)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Pixels ``uint8 [F, H, W, 3]`` -> latents ``float32 [1, z_dim, F', H / 8, W / 8]``.

        ``F' = latent_frames(F)``: the last frame is repeated up to ``1 + 4 (F' - 1)`` frames first.
        """
        video = torch.as_tensor(video)
        if video.dim() != 4 or video.shape[-1] != 3 or video.dtype != torch.uint8 or len(video) == 0:
            raise ValueError(f"video must be non-empty uint8 [F, H, W, 3], got {video.dtype} {tuple(video.shape)}")
        pad = 1 + self.temporal_stride * (self.latent_frames(len(video)) - 1) - len(video)
        if pad:
            video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
        pixels = video.to(self.device).permute(3, 0, 1, 2)[None].float()  # copy uint8 first, then one float copy
        return self.encode_pixels(pixels.div_(127.5).sub_(1.0))

    def _denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.to(self.device, torch.float32) * self.std.to(self.device) + self.mean.to(self.device)
        return z.to(self.dtype)

    @staticmethod
    def _to_uint8(video: torch.Tensor) -> torch.Tensor:
        """``[1, 3, F, H, W]`` in [-1, 1] -> ``uint8 [F, H, W, 3]`` on the CPU (in place: no extra copies)."""
        video = video.float().clamp_(-1.0, 1.0).add_(1.0).mul_(127.5).round_()
        return video[0].permute(1, 2, 3, 0).to(torch.uint8).cpu()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[1, z_dim, F', h, w]`` -> pixels ``uint8 [1 + 4 (F' - 1), 8 h, 8 w, 3]`` (CPU).

        The first latent frame is decoded as an image (one frame), as the start of a timeline.
        """
        return self._to_uint8(self.model.decode(self._denormalise(latents)).sample)

    def _run_decoder(self, latents: torch.Tensor, caches: list, first: bool, keep: bool) -> torch.Tensor | None:
        """Run the causal decoder frame by frame, updating ``caches`` in place.

        Parameters
        ----------
        latents : Tensor ``[1, z_dim, F', h, w]``, normalised
        caches : list
            The decoder's per-layer caches (one entry per causal convolution).
        first : bool
            Whether ``latents`` start the timeline (their first frame is decoded as an image).
        keep : bool
            Return the frames (``[1, 3, F, H, W]``); otherwise they are dropped as they come.
        """
        x = self.model.post_quant_conv(self._denormalise(latents))  # kernel 1: no temporal state
        frames = []
        for i in range(x.shape[2]):
            out = self.model.decoder(x[:, :, i : i + 1], feat_cache=caches, feat_idx=[0], first_chunk=first and i == 0)
            if keep:
                frames.append(out)
        return torch.cat(frames, dim=2) if keep else None

    def _fresh_caches(self) -> list:
        self.model.clear_cache()
        return list(self.model._feat_map)  # diffusers' per-convolution decoder caches, all empty

    @torch.no_grad()
    def decoder_state(self, context: torch.Tensor, warmup: int | None = None) -> list:
        """The causal decoder's caches after decoding a context's latent frames (pixels dropped).

        Parameters
        ----------
        context : Tensor ``[1, z_dim, q0, h, w]``
            The context's latents (normalised), the timeline's start.
        warmup : int, optional
            Decode only the last ``warmup`` context latent frames (the first of them as the timeline's
            start), an approximation that saves time; ``None`` decodes the whole context (exact).

        Returns
        -------
        list: a fresh copy of the caches for each call; the state of the latest context is kept and
        reused while that tensor is alive and unchanged.
        """
        key = (context._version, warmup, tuple(context.shape))
        cached = self._context_state
        if cached is None or cached[0]() is not context or cached[1] != key:
            frames = context if warmup is None else context[:, :, -int(warmup):]
            caches = self._fresh_caches()
            if frames.shape[2]:
                self._run_decoder(frames, caches, first=True, keep=False)
            self._context_state = (weakref.ref(context), key, caches)
            cached = self._context_state
        return list(cached[2])  # the decoder replaces cache entries, never writes into them

    @torch.no_grad()
    def decode_continuation(self, latents: torch.Tensor, context: torch.Tensor,
                            warmup: int | None = None) -> torch.Tensor:
        """Latents that follow ``context`` on the timeline -> pixels ``uint8 [4 F', 8 h, 8 w, 3]`` (CPU).

        Parameters
        ----------
        latents : Tensor ``[1, z_dim, F', h, w]``
            The continuation (normalised).
        context : Tensor ``[1, z_dim, q0, h, w]``
            The latents before it; an empty context decodes ``latents`` as a timeline of their own.
        warmup : int, optional
            See :meth:`decoder_state`.

        Returns
        -------
        Tensor ``uint8 [4 F', H, W, 3]``: the frames a decode of ``context + latents`` gives for ``latents``
        (``1 + 4 (F' - 1)`` when the context is empty).
        """
        if warmup is not None and warmup < 1:
            raise ConfigError(f"decode warm-up must be at least one latent frame (or null: the whole context), "
                              f"got {warmup}")
        caches = self.decoder_state(context, warmup)
        frames = self._run_decoder(latents, caches, first=context.shape[2] == 0, keep=True)
        assert frames is not None
        return self._to_uint8(frames)
