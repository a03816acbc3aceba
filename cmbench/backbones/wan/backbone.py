"""One backbone class for every real Wan-family model: LingBot World v2 and the Wan2.1-T2V-1.3B family.

:class:`WanBackbone` wires the causal DiT (:class:`~cmbench.backbones.dit.CausalWanDiT`) to the Wan VAE,
the umt5 text encoder and, when the DiT has them, LingBot's I2V channels and camera path:

- ``encode`` / ``decode``: :class:`~cmbench.backbones.wan.vae.WanVAE` (stride 4 in time, 8 in space);
  ``decode_continuation``: the continuation decoded after the context (the causal decoder warmed up
  on the context's latents), 4 frames per latent frame, as the authors score it;
- ``condition(task)``: a :class:`WanCondition` covering the whole timeline: the prompts (by default
  ``continue_prompt`` for every frame, context included, as the authors' harness; ``context_prompts=
  "clips"`` spreads the 6 clip prompts over the context instead), the camera plan (the task's
  ``camera`` extension, else the static identity camera with LingBot's example intrinsics) and the
  first-frame latents (I2V);
- ``denoise``: one DiT call on a chunk. Wan-family checkpoints predict the flow velocity
  ``v = eps - x0``; the backbone returns ``x0 = x_t - t * v``. A chunk's text is the prompt of its
  first latent frame.

Precision: the DiT runs in ``dtype`` (bf16 on GPUs) with Wan's float32 islands (LingBot: a float32
residual stream and head too); latents stay float32.
With ``offload_kv`` the KV cache lives in host memory and is staged per layer
(:class:`~cmbench.backbones.wan.offload.HostOffloadAttention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import torch

from cmbench.backbones.base import Geometry
from cmbench.backbones.dit import CausalWanDiT, grid_positions
from cmbench.backbones.wan.camera import EXTENSION as CAMERA_EXTENSION
from cmbench.backbones.wan.camera import CameraPlan, default_intrinsics, plan_from_extension
from cmbench.backbones.wan.i2v import FirstFrameLatents
from cmbench.backbones.wan.offload import HostOffloadAttention
from cmbench.backbones.wan.precision import param_dtype
from cmbench.backbones.wan.text import TextEncoder
from cmbench.backbones.wan.timeline import ContextTimeline, read_timeline
from cmbench.backbones.wan.vae import WanVAE
from cmbench.errors import ConfigError

if TYPE_CHECKING:
    from cmbench.cache.kv_cache import KVCache

EXPECTED_CONTINUATION = 16  # latent frames the I2V latents are first encoded for beyond the context
CONTEXT_PROMPTS = ("continue", "clips")


@dataclass
class WanCondition:
    """What one task conditions on, over its whole timeline (context then continuation).

    Attributes
    ----------
    task_id : str
    clip_prompts : tuple of str
        Context clip prompts (used over the context only with ``context_prompts="clips"``).
    continue_prompt : str
        The prompt of every continuation frame, and of every context frame by default.
    context_frames : int
        ``q0``, latent frames of the prepared context.
    camera : CameraPlan or None
        None for a backbone without a camera path.
    first_frame : FirstFrameLatents or None
        None for a backbone without I2V input channels.
    context_prompts : {"continue", "clips"}
        ``"continue"`` (the authors' harness): ``continue_prompt`` conditions the whole prefill too.
        ``"clips"``: the clip prompts are spread evenly over the context's latent frames (frame ``f``
        of ``q0`` takes clip ``floor(n f / q0)``).
    """

    task_id: str
    clip_prompts: tuple[str, ...]
    continue_prompt: str
    context_frames: int
    camera: CameraPlan | None = None
    first_frame: FirstFrameLatents | None = None
    context_prompts: str = "continue"

    def __post_init__(self) -> None:
        if self.context_prompts not in CONTEXT_PROMPTS:
            raise ConfigError(f"context_prompts must be one of {CONTEXT_PROMPTS}, got {self.context_prompts!r}")

    def prompt_at(self, frame: int) -> str:
        """The prompt of absolute latent frame ``frame``."""
        if frame >= self.context_frames or not self.clip_prompts or self.context_prompts == "continue":
            return self.continue_prompt
        n = len(self.clip_prompts)
        return self.clip_prompts[min(n - 1, frame * n // self.context_frames)]


class DitInputs(NamedTuple):
    """One chunk's DiT inputs, in the DiT's dtype on its device.

    Attributes
    ----------
    x : Tensor ``[B, C_in, f, h, w]``
        The noisy latents, with the I2V channels for an I2V DiT.
    text : Tensor ``[B, text_len, text_dim]``
    camera : Tensor ``[B, 384, f, h, w]`` or None
        None for a DiT without a camera path.
    """

    x: torch.Tensor
    text: torch.Tensor
    camera: torch.Tensor | None


class WanBackbone:
    """A real Wan-family backbone (implements :class:`cmbench.backbones.base.Backbone`).

    Parameters
    ----------
    dit : CausalWanDiT
        Loaded and cast (:func:`~cmbench.backbones.wan.precision.cast_for_inference`), on ``device``.
    vae : WanVAE
    text_encoder : TextEncoder
    height, width : int
        Pixel frame size (480 x 832 for the real models).
    chunk_frames : int
        Latent frames per AR chunk (LingBot 4, Self-Forcing family 3).
    fps : float
        Frame rate of the prepared context (the evaluator's ``backbone.context.fps``).
    camera_intrinsics : sequence of 4 floats, optional
        ``(fx, fy, cx, cy)`` of the default static camera, pixels of the ``height x width`` frame;
        default LingBot's example intrinsics (502.91, 503.11, 415.78, 239.78) at 832x480, scaled to the
        frame size (:func:`~cmbench.backbones.wan.camera.default_intrinsics`).
    device : str
    offload_kv : bool
        Keep the KV cache in host memory and stage it per layer.
    name : str
        Named in errors.
    context_prompts : {"continue", "clips"}
        What conditions the prefill (see :class:`WanCondition`).
    decode_warmup : int, optional
        Latent frames of the context the VAE decoder runs over before a continuation; ``None``
        (default) the whole context, which gives exactly the frames of a whole-timeline decode.
    """

    def __init__(self, dit: CausalWanDiT, vae: WanVAE, text_encoder: TextEncoder, height: int, width: int,
                 chunk_frames: int, fps: float = 16.0, camera_intrinsics: Sequence[float] | None = None,
                 device: str = "cpu", offload_kv: bool = False, name: str = "wan", context_prompts: str = "continue",
                 decode_warmup: int | None = None) -> None:
        cfg = dit.cfg
        self.dit, self.vae, self.text = dit, vae, text_encoder
        self.name = name
        self.device = torch.device(device)
        self.height, self.width, self.fps = int(height), int(width), float(fps)
        self.offload_kv = bool(offload_kv)
        if context_prompts not in CONTEXT_PROMPTS:
            raise ConfigError(f"{name}: context_prompts must be one of {CONTEXT_PROMPTS}, got {context_prompts!r}")
        self.context_prompts = context_prompts
        if decode_warmup is not None and int(decode_warmup) < 1:
            raise ConfigError(f"{name}: decode_warmup must be at least 1 latent frame, or null for the whole "
                              f"context; got {decode_warmup}")
        self.decode_warmup = None if decode_warmup is None else int(decode_warmup)
        stride = vae.spatial_stride
        if self.height % stride or self.width % stride:
            raise ConfigError(f"{name}: frame {height}x{width} is not a multiple of the VAE stride {stride}")
        if cfg.out_channels != vae.z_dim:
            raise ConfigError(f"{name}: the DiT predicts {cfg.out_channels} channels, the VAE has z_dim {vae.z_dim}")
        self.extra_channels = cfg.in_channels - cfg.out_channels
        if self.extra_channels not in (0, vae.temporal_stride + vae.z_dim):
            raise ConfigError(
                f"{name}: DiT in_channels {cfg.in_channels} is neither {cfg.out_channels} (T2V) nor "
                f"{cfg.out_channels} + {vae.temporal_stride} mask + {vae.z_dim} first-frame channels (I2V)"
            )
        if cfg.text_dim != text_encoder.dim:
            raise ConfigError(f"{name}: the DiT expects text_dim {cfg.text_dim}, "
                              f"the text encoder gives {text_encoder.dim}")
        if cfg.camera_dim is not None and cfg.camera_dim != 6 * stride * stride:
            raise ConfigError(f"{name}: camera_dim {cfg.camera_dim} is not 6 Plucker channels "
                              f"x {stride}x{stride} pixels")
        if camera_intrinsics is None:
            camera_intrinsics = default_intrinsics(self.height, self.width)
        self.camera_intrinsics = tuple(float(v) for v in camera_intrinsics)
        self.geometry = Geometry(
            num_layers=cfg.num_layers, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
            latent_channels=cfg.out_channels, latent_height=self.height // stride, latent_width=self.width // stride,
            rope=dit.rope, patch=cfg.patch_size, chunk_frames=chunk_frames,
        )
        self._timelines: dict[str, ContextTimeline] = {}
        self._first_frames: dict[str, FirstFrameLatents] = {}

    # ------------------------------------------------------------------ pixels <-> latents
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Pixels ``uint8 [F, H, W, 3]`` -> latents ``float32 [1, 16, 1 + (F - 1) // 4, H / 8, W / 8]``."""
        video = torch.as_tensor(video)
        if video.dim() != 4 or tuple(video.shape[1:]) != (self.height, self.width, 3):
            raise ConfigError(f"{self.name}: frames must be [F, {self.height}, {self.width}, 3], "
                              f"got {tuple(video.shape)}")
        return self.vae.encode(video)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[1, 16, F', h, w]`` -> pixels ``uint8 [1 + 4 (F' - 1), H, W, 3]`` (a timeline of its own)."""
        return self.vae.decode(latents)

    def decode_continuation(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """A continuation decoded after its context: ``[1, 16, F', h, w]`` -> ``uint8 [4 F', H, W, 3]``.

        Parameters
        ----------
        latents : Tensor ``[1, 16, F', h, w]``
        context : Tensor ``[1, 16, q0, h, w]``
            The context latents the continuation follows (the decoder runs over them first, or over
            the last ``decode_warmup`` of them).
        """
        return self.vae.decode_continuation(latents, context, self.decode_warmup)

    # ------------------------------------------------------------------ conditioning
    def timeline(self, task: Any) -> ContextTimeline:
        """Length (and first frame) of the task's prepared context, read once per video."""
        path = str(task.video_path)
        if path not in self._timelines:
            self._timelines[path] = read_timeline(path, self.fps, self.height, self.width,
                                                  self.geometry.chunk_frames, self.vae.temporal_stride)
        return self._timelines[path]

    def camera_plan(self, task: Any) -> CameraPlan:
        """The task's camera plan (its ``camera`` extension), else the static identity camera."""
        ext = getattr(task, "extra", {}).get(CAMERA_EXTENSION)
        if ext is None:
            return CameraPlan.static(self.camera_intrinsics)
        return plan_from_extension(ext, self.height, self.width, self.vae.temporal_stride,
                                   where=f"task {getattr(task, 'task_id', '?')}")

    def condition(self, task: Any) -> WanCondition:
        """Prompts, camera and first frame of a CMBench task (see :class:`WanCondition`)."""
        if getattr(task, "video_path", None) is None:
            raise ConfigError(f"{self.name}: task {getattr(task, 'task_id', '?')} has no context video")
        tl = self.timeline(task)
        first = None
        if self.extra_channels:
            key = str(task.video_path)
            if key not in self._first_frames:
                self._first_frames = {key: FirstFrameLatents(self.vae, tl.first_frame,
                                                             tl.latent_frames + EXPECTED_CONTINUATION)}
            first = self._first_frames[key]
        camera = self.camera_plan(task) if self.dit.cfg.camera_dim is not None else None
        return WanCondition(task.task_id, tuple(task.context_clip_prompts), task.continue_prompt,
                            tl.latent_frames, camera, first, self.context_prompts)

    def camera_poses(self, cond: WanCondition) -> torch.Tensor | None:
        """Camera-to-world pose of every latent frame, ``[F, 4, 4]`` float64, from the task's camera plan
        (``None`` without one, or for the static camera: no poses)."""
        return None if cond.camera is None else cond.camera.absolute()

    def prefill_key(self, cond: WanCondition, context_frames: int) -> tuple:
        """What a prefill of the first ``context_frames`` latent frames reads of ``cond``: each frame's
        prompt and the camera's poses and intrinsics over those frames. The first-frame latents come
        from the context video, the same for every task of one context."""
        prompts = tuple(cond.prompt_at(f) for f in range(context_frames))
        if cond.camera is None:
            return prompts, None
        poses, intrinsics = cond.camera.window(0, context_frames)
        return prompts, (poses.cpu().numpy().tobytes(), intrinsics.cpu().numpy().tobytes())

    # ------------------------------------------------------------------ the model call
    def dit_inputs(self, x_t: torch.Tensor, frame_start: int, cond: WanCondition) -> DitInputs:
        """The DiT's inputs for a chunk: ``x`` (with I2V channels), ``text`` and ``camera``.

        Returns
        -------
        DitInputs with ``x [B, C_in, f, h, w]``, ``text [B, text_len, text_dim]``, ``camera [B, 384, f, h, w]``
        or None, all in the DiT's dtype on its device.
        """
        b, _, f, _, _ = x_t.shape
        dtype, device = param_dtype(self.dit), self.device
        x = x_t.to(device, dtype)
        if self.extra_channels:
            if cond.first_frame is None:
                raise ConfigError(f"{self.name}: the I2V DiT needs a first frame in its condition")
            y = cond.first_frame.channels(frame_start, f).to(device, dtype)
            x = torch.cat([x, y.expand(b, -1, -1, -1, -1)], dim=1)
        text = self.text.encode(cond.prompt_at(frame_start)).to(device, dtype).expand(b, -1, -1)
        camera = None
        if self.dit.cfg.camera_dim is not None:
            if cond.camera is None:
                raise ConfigError(f"{self.name}: the camera-conditioned DiT needs a camera plan in its condition")
            cam = cond.camera.latent_map(frame_start, f, self.height, self.width, self.vae.spatial_stride, device)
            camera = cam.to(dtype).expand(b, -1, -1, -1, -1)
        return DitInputs(x, text, camera)

    def velocity(self, x_t: torch.Tensor, t: float, attention, frame_start: int, cond: WanCondition) -> torch.Tensor:
        """The DiT's flow prediction ``v [B, 16, f, h, w]`` (float32) for one chunk."""
        inputs = self.dit_inputs(x_t, frame_start, cond)
        b, _, f, _, _ = x_t.shape
        g = self.geometry
        tt = torch.full((b, f), float(t), device=self.device)
        positions = grid_positions(frame_start, f, g.token_rows, g.token_cols)
        v = self.dit(inputs.x, tt, positions, attention, text=inputs.text, camera=inputs.camera)
        return v.float()

    def denoise(self, x_t: torch.Tensor, t: float, cache: "KVCache", frame_start: int,
                cond: WanCondition) -> torch.Tensor:
        """Predict the clean chunk (the :class:`~cmbench.backbones.base.Backbone` call).

        Parameters
        ----------
        x_t : Tensor ``[B, 16, f, h, w]``
        t : float
            Noise level in [0, 1]; ``0`` writes the clean K/V.
        cache : KVCache
        frame_start : int
        cond : WanCondition

        Returns
        -------
        Tensor ``[B, 16, f, h, w]``: ``x0 = x_t - t * v`` in ``x_t``'s dtype, on ``x_t``'s device.
        """
        attention = HostOffloadAttention(cache) if self.offload_kv else cache
        with torch.no_grad():
            v = self.velocity(x_t, t, attention, frame_start, cond)
        return (x_t.float() - float(t) * v.to(x_t.device)).to(x_t.dtype)
