"""LingBot World's camera conditioning: Plucker rays folded onto the latent grid.

For every pixel of a ``H x W`` frame the camera gives a ray: origin ``o`` (the camera centre) and unit
direction ``d`` (OpenCV convention: x right, y down, z forward; pixel centres at ``+0.5``), rotated
into the reference frame. LingBot's Plucker map is ``[o, d]`` (6 channels, origin first), folded over
each 8x8 pixel patch of the VAE into ``6 * 64 = 384`` channels per latent pixel, ordered (channel,
row in patch, column in patch).

Poses are made relative as LingBot does: latent frame ``j`` takes the camera of pixel frame ``4 j``;
frame 0 is the identity and frame ``j >= 1`` carries the motion from frame ``j - 1``
(``inv(P[j-1]) @ P[j]``); translations are divided by their largest norm over the plan when the camera
moves. The default plan is the static identity camera (every frame at the origin, looking down +z)
with LingBot's example intrinsics (:func:`default_intrinsics`), as the authors' harness conditions
every task.

A task may bring its own plan in the row extension ``camera``::

    "camera": {"c2w": [[[...4x4...]], ...],   # camera-to-world (OpenCV), one per pixel frame of the
                                              # timeline (context then continuation) at the backbone fps
               "intrinsics": [fx, fy, cx, cy],   # or one [fx, fy, cx, cy] per pixel frame
               "image_size": [H0, W0]}           # optional: size the intrinsics refer to
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from cmbench.errors import ConfigError

PLUCKER_CHANNELS = 6
EXTENSION = "camera"
# (fx, fy, cx, cy) of LingBot World's example camera at 832x480: the authors' harness uses them for every
# task's camera (static identity by default), scaled to other frame sizes
LINGBOT_INTRINSICS_832X480 = (502.9116, 503.10812, 415.77786, 239.77779)
CACHED_MAPS = 8  # latent maps kept per plan (every denoising call of a chunk asks for the same one)


def default_intrinsics(height: int, width: int) -> tuple[float, float, float, float]:
    """LingBot's example intrinsics (:data:`LINGBOT_INTRINSICS_832X480`) for a ``height x width`` frame."""
    fx, fy, cx, cy = LINGBOT_INTRINSICS_832X480
    sx, sy = width / 832.0, height / 480.0
    return fx * sx, fy * sy, cx * sx, cy * sy


def relative_framewise(c2w: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """Frame-to-frame camera motion.

    Parameters
    ----------
    c2w : Tensor, shape ``[F, 4, 4]``
        Camera-to-world poses.
    normalize : bool
        Divide translations by their largest norm (when it is positive).

    Returns
    -------
    Tensor, shape ``[F, 4, 4]``, float64: identity, then ``inv(c2w[j-1]) @ c2w[j]``.
    """
    poses = c2w.to(torch.float64)
    rel = torch.eye(4, dtype=torch.float64).repeat(len(poses), 1, 1)
    if len(poses) > 1:
        rel[1:] = torch.linalg.inv(poses[:-1]) @ poses[1:]
    if normalize:
        largest = rel[:, :3, 3].norm(dim=-1).max()
        if largest > 0:
            rel[:, :3, 3] /= largest
    return rel


def plucker_rays(c2w: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Per-pixel rays ``[o, d]``.

    Parameters
    ----------
    c2w : Tensor, shape ``[F, 4, 4]``
    intrinsics : Tensor, shape ``[F, 4]``
        ``(fx, fy, cx, cy)`` in pixels of the ``height x width`` frame.
    height, width : int

    Returns
    -------
    Tensor, shape ``[F, height, width, 6]``, float32: origin (3) then unit direction (3).
    """
    f = len(c2w)
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64) + 0.5,
                            torch.arange(width, dtype=torch.float64) + 0.5, indexing="ij")
    k = intrinsics.to(torch.float64)
    fx, fy, cx, cy = (k[:, i, None, None] for i in range(4))
    dirs = torch.stack([(xs - cx) / fx, (ys - cy) / fy, torch.ones(f, height, width, dtype=torch.float64)], dim=-1)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    rot = c2w[:, :3, :3].to(torch.float64)
    rays_d = torch.einsum("fhwj,fij->fhwi", dirs, rot)
    rays_o = c2w[:, None, None, :3, 3].to(torch.float64).expand(f, height, width, 3)
    return torch.cat([rays_o, rays_d], dim=-1).float()


def fold_to_latent(rays: torch.Tensor, stride: int = 8) -> torch.Tensor:
    """Fold a per-pixel map onto the latent grid.

    Parameters
    ----------
    rays : Tensor, shape ``[F, H, W, C]``
    stride : int
        Pixels per latent pixel side (the VAE's spatial stride).

    Returns
    -------
    Tensor, shape ``[1, C * stride**2, F, H / stride, W / stride]``: channel ``c * stride**2 + dy * stride + dx``.
    """
    f, h, w, c = rays.shape
    if h % stride or w % stride:
        raise ValueError(f"frame {h}x{w} is not divisible by the fold {stride}")
    x = rays.reshape(f, h // stride, stride, w // stride, stride, c)
    x = x.permute(5, 2, 4, 0, 1, 3).reshape(c * stride * stride, f, h // stride, w // stride)
    return x[None]


class CameraPlan:
    """Relative camera and intrinsics of every latent frame of a timeline.

    Parameters
    ----------
    relative : Tensor, shape ``[N, 4, 4]`` or None
        Frame-to-frame motion per latent frame (:func:`relative_framewise`); ``None`` is the static
        identity camera for any number of frames.
    intrinsics : Tensor, shape ``[N, 4]`` or ``[4]``
        ``(fx, fy, cx, cy)`` in pixels of the backbone's frame.
    """

    def __init__(self, relative: torch.Tensor | None, intrinsics: torch.Tensor) -> None:
        self.relative = relative
        self.intrinsics = torch.as_tensor(intrinsics, dtype=torch.float64)
        if self.intrinsics.shape[-1] != 4:
            raise ConfigError(f"camera intrinsics must be (fx, fy, cx, cy), got shape {tuple(self.intrinsics.shape)}")
        if bool((self.intrinsics[..., :2] <= 0).any()):
            raise ConfigError("camera focal lengths must be positive")
        self._maps: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    @classmethod
    def static(cls, intrinsics: Sequence[float]) -> "CameraPlan":
        """The static identity camera (LingBot's default when no poses are given)."""
        return cls(None, torch.as_tensor(intrinsics, dtype=torch.float64))

    @property
    def is_static(self) -> bool:
        return self.relative is None

    @property
    def num_frames(self) -> int | None:
        """Latent frames covered (None: any)."""
        return None if self.relative is None else len(self.relative)

    def absolute(self) -> torch.Tensor | None:
        """Camera-to-world pose of every latent frame, ``[N, 4, 4]`` float64 (the first frame's is the
        identity: the relative motions chained); ``None`` for the static camera (no poses)."""
        if self.relative is None:
            return None
        out = self.relative.clone()
        for j in range(1, len(out)):
            out[j] = out[j - 1] @ self.relative[j]
        return out

    def window(self, frame_start: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Relative poses ``[frames, 4, 4]`` and intrinsics ``[frames, 4]`` of latent frames ``frame_start..``."""
        if self.relative is None:
            poses = torch.eye(4, dtype=torch.float64).repeat(frames, 1, 1)
        else:
            if frame_start < 0 or frame_start + frames > len(self.relative):
                raise ConfigError(f"the camera plan covers latent frames 0..{len(self.relative) - 1}, but frames "
                                  f"{frame_start}..{frame_start + frames - 1} were asked for")
            poses = self.relative[frame_start : frame_start + frames]
        k = self.intrinsics
        if k.dim() == 1:
            k = k.expand(frames, 4)
        else:
            if frame_start + frames > len(k):
                raise ConfigError(f"camera intrinsics cover {len(k)} latent frames, frames up to "
                                  f"{frame_start + frames - 1} were asked for")
            k = k[frame_start : frame_start + frames]
        return poses, k

    def latent_map(self, frame_start: int, frames: int, height: int, width: int, stride: int = 8,
                   device: str | torch.device | None = None) -> torch.Tensor:
        """The folded Plucker map of some latent frames (cached: the calls of one chunk share it).

        Returns
        -------
        Tensor, shape ``[1, 6 * stride**2, frames, height / stride, width / stride]``, float32 on
        ``device`` (CPU by default). Treat it as read-only.
        """
        uniform = self.relative is None and self.intrinsics.dim() == 1  # every frame alike
        key = (None if uniform else frame_start, frames, height, width, stride, str(device))
        if key in self._maps:
            self._maps.move_to_end(key)
            return self._maps[key]
        poses, k = self.window(frame_start, frames)
        if uniform:  # compute one frame
            one = fold_to_latent(plucker_rays(poses[:1], k[:1], height, width), stride)
            out = one.expand(-1, -1, frames, -1, -1).contiguous()
        else:
            out = fold_to_latent(plucker_rays(poses, k, height, width), stride)
        out = out.to(device) if device is not None else out
        self._maps[key] = out
        if len(self._maps) > CACHED_MAPS:
            self._maps.popitem(last=False)
        return out


def plan_from_extension(ext: Mapping[str, Any], height: int, width: int, temporal_stride: int = 4,
                        where: str = "task") -> CameraPlan:
    """A :class:`CameraPlan` from a task's ``camera`` extension (see the module docstring).

    Latent frame ``j`` takes pixel frame ``temporal_stride * j``; a plan of ``n`` pixel frames covers
    ``(n - 1) // temporal_stride + 1`` latent frames.
    """
    if not isinstance(ext, Mapping) or "c2w" not in ext or "intrinsics" not in ext:
        raise ConfigError(f"{where}: the '{EXTENSION}' extension needs 'c2w' (4x4 per pixel frame) and 'intrinsics'")
    c2w = torch.as_tensor(np.asarray(ext["c2w"], dtype=np.float64))
    if c2w.dim() != 3 or tuple(c2w.shape[1:]) != (4, 4) or len(c2w) == 0:
        raise ConfigError(f"{where}: camera c2w must be a list of 4x4 matrices, got shape {tuple(c2w.shape)}")
    picks = torch.arange(0, len(c2w), temporal_stride)
    k = torch.as_tensor(np.asarray(ext["intrinsics"], dtype=np.float64))
    if k.dim() == 2:
        if len(k) != len(c2w):
            raise ConfigError(f"{where}: {len(k)} intrinsics rows for {len(c2w)} camera poses")
        k = k[picks]
    if "image_size" in ext:
        h0, w0 = (float(v) for v in ext["image_size"])
        scale = torch.tensor([width / w0, height / h0, width / w0, height / h0], dtype=torch.float64)
        k = k * scale
    return CameraPlan(relative_framewise(c2w[picks]), k)
