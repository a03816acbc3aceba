"""The tiny MiniWorld world model: the causal DiT at CPU size, conditioned on the camera.

Geometry (docs/architecture.md): frames 32x32 RGB; the "VAE" is space-to-depth 2x2 (``C = 12``,
latent 16x16, values in [-1, 1]), no temporal compression; DiT patch 1x2x2, so one token covers
4x4 pixels and a frame has 64 tokens; chunks of 4 latent frames.

The camera of a MiniWorld frame is the horizontal offset ``camera_x`` (pixels) of a 32x32 window
on a wrap-around panorama ``W`` pixels wide. The model sees it twice:

- RoPE positions: a token's position is (frame index, row, world column) with world column
  ``(camera_x / 4 + col) mod (W / 4)``; the world-column axis is periodic with period ``W / 4``
  tokens, so a place seen long ago has exactly the rotary phase of the same place now. This is
  what lets attention retrieve it from the cache (tiny-model-findings.md, point 1).
- LingBot's camera path: a camera map with, per latent pixel, the direction of its viewing ray on
  the panorama cylinder (``sin phi, cos phi, elevation`` with ``phi = 2 pi x / W`` at the latent
  pixel's centre ``x``), embedded and injected after every self-attention.

Latent channel ``4 * c + 2 * dy + dx`` holds colour ``c`` of pixel ``(2 i + dy, 2 j + dx)``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from cmbench.backbones.base import Geometry
from cmbench.backbones.dit import Attention, CausalWanDiT, DiTConfig
from cmbench.cache.rope import RopeAxis, RopeSpec
from cmbench.errors import ConfigError
from cmbench.miniworld.readers import EXTENSION as MINIWORLD_EXTENSION

if TYPE_CHECKING:
    from cmbench.cache.kv_cache import KVCache

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "tiny_miniworld_dynamic.safetensors"  # trained on the dynamic world (the default)
STATIC_WEIGHTS = WEIGHTS_DIR / "tiny_miniworld.safetensors"  # trained on the static world (``backbone=tiny_static``)
FRAME_SIZE = 32
TOKEN_PX = 4  # pixels per token side (space-to-depth 2 x DiT patch 2)
CAMERA_CHANNELS = 3


@dataclass(frozen=True)
class TinyConfig:
    """Everything that rebuilds a tiny world model exactly (stored as JSON next to its weights).

    Parameters
    ----------
    dit : DiTConfig
        The transformer; ``in_channels = out_channels = 12`` and ``camera_dim = 3``.
    rope : dict
        The three rotary axes ``{"t": {...}, "h": {...}, "w": {...}}`` as :class:`RopeAxis` fields.
        The ``w`` axis must be periodic with period ``world_width / 4``.
    world_width : int
        Panorama width ``W`` in pixels (a multiple of 4).
    chunk_frames : int
        Latent frames per AR chunk.
    keys : {"world", "screen"}
        What the ``w`` rotary axis of a token holds: its world column ``(camera_x / 4 + col) mod
        (W / 4)`` (the axis must then be periodic with period ``W / 4``), or its column on the
        screen (0..7), as real video models do (the camera then reaches the model only through the
        injected camera map, and earlier views must be found by content).
    training : dict
        How the weights were trained (informational: script settings, steps, seed).
    """

    dit: DiTConfig
    rope: dict
    world_width: int = 256
    chunk_frames: int = 4
    keys: str = "world"
    training: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.world_width % TOKEN_PX:
            raise ConfigError(f"world_width must be a multiple of {TOKEN_PX}, got {self.world_width}")
        if self.keys not in ("world", "screen"):
            raise ConfigError(f"keys must be 'world' or 'screen', got {self.keys!r}")
        spec = self.rope_spec()
        if self.keys == "world" and (spec.w.kind != "periodic" or spec.w.period != self.world_width / TOKEN_PX):
            raise ConfigError(
                f"the world-column rope axis must be periodic with period {self.world_width // TOKEN_PX} "
                f"(world_width / {TOKEN_PX}), got kind={spec.w.kind!r} period={spec.w.period}"
            )
        d = self.dit
        if (d.in_channels, d.out_channels, d.camera_dim, tuple(d.patch_size)) != (12, 12, CAMERA_CHANNELS, (1, 2, 2)):
            raise ConfigError("the tiny DiT needs in/out channels 12, camera_dim 3 and patch (1, 2, 2)")

    def rope_spec(self) -> RopeSpec:
        """The :class:`RopeSpec` of one head."""
        return RopeSpec(*(RopeAxis(**self.rope[a]) for a in ("t", "h", "w")))

    def to_dict(self) -> dict:
        return {
            "dit": self.dit.to_dict(),
            "rope": self.rope,
            "world_width": self.world_width,
            "chunk_frames": self.chunk_frames,
            "keys": self.keys,
            "training": self.training,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TinyConfig":
        d = dict(d)
        d["dit"] = DiTConfig.from_dict(d["dit"])
        return cls(**d)


def default_config(world_width: int = 256, keys: str = "world", time_theta: float = 10000.0) -> TinyConfig:
    """The tiny model: 4 layers, width 128, 4 heads of 32 channels.

    Head channels with world keys: 4 temporal (log rule, base ``time_theta``), 8 row (periodic,
    period 16 > 8 rows, so no aliasing), 20 world column (periodic with the panorama's period
    ``W / 4`` tokens: harmonics 1..10). With screen keys (the real models' layout): 16 temporal,
    8 row, 8 screen column (periodic, period 16 > 8 columns).
    """
    dit = DiTConfig(in_channels=12, out_channels=12, dim=128, ffn_dim=512, num_heads=4, num_layers=4, camera_dim=3)
    if keys == "screen":
        rope = {
            "t": {"dim": 16, "kind": "log", "theta": time_theta},
            "h": {"dim": 8, "kind": "periodic", "period": 16.0},
            "w": {"dim": 8, "kind": "periodic", "period": 16.0},
        }
    else:
        rope = {
            "t": {"dim": 4, "kind": "log", "theta": time_theta},
            "h": {"dim": 8, "kind": "periodic", "period": 16.0},
            "w": {"dim": 20, "kind": "periodic", "period": float(world_width // TOKEN_PX)},
        }
    return TinyConfig(dit=dit, rope=rope, world_width=world_width, chunk_frames=4, keys=keys)


@dataclass(frozen=True)
class CameraPlan:
    """The camera of every frame of a timeline (context followed by continuation).

    Parameters
    ----------
    camera_x : ndarray, ``int [F]``
        Horizontal offset in pixels of each frame's window (multiples of 4).
    """

    camera_x: np.ndarray

    def __post_init__(self) -> None:
        cx = np.asarray(self.camera_x, dtype=np.int64)
        if cx.ndim != 1:
            raise ValueError(f"camera_x must be 1-D, got shape {cx.shape}")
        if np.any(cx % TOKEN_PX):
            raise ValueError(f"camera offsets must be whole {TOKEN_PX}-px steps")
        object.__setattr__(self, "camera_x", cx)

    def window(self, frame_start: int, frames: int) -> np.ndarray:
        """Offsets of frames ``[frame_start, frame_start + frames)``, ``int [frames]``."""
        if frame_start < 0 or frame_start + frames > len(self.camera_x):
            raise ValueError(
                f"frames {frame_start}..{frame_start + frames - 1} are outside the camera plan "
                f"of {len(self.camera_x)} frames"
            )
        return self.camera_x[frame_start : frame_start + frames]


def space_to_depth(video: torch.Tensor) -> torch.Tensor:
    """Pixels to tiny latents.

    Parameters
    ----------
    video : Tensor, ``uint8 [F, H, W, 3]``

    Returns
    -------
    Tensor, ``float32 [1, 12, F, H / 2, W / 2]`` in [-1, 1]
    """
    f, h, w, c = video.shape
    x = video.float().div(127.5).sub(1.0).reshape(f, h // 2, 2, w // 2, 2, c)
    return x.permute(5, 2, 4, 0, 1, 3).reshape(1, c * 4, f, h // 2, w // 2)


def depth_to_space(latents: torch.Tensor) -> torch.Tensor:
    """Tiny latents to pixels (inverse of :func:`space_to_depth`, clipped and rounded).

    Parameters
    ----------
    latents : Tensor, ``[1, 12, F, h, w]``

    Returns
    -------
    Tensor, ``uint8 [F, 2h, 2w, 3]``
    """
    _, c4, f, h, w = latents.shape
    x = latents[0].float().reshape(c4 // 4, 2, 2, f, h, w).permute(3, 4, 1, 5, 2, 0).reshape(f, 2 * h, 2 * w, c4 // 4)
    return x.add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8)


class TinyWorldModel:
    """The tiny MiniWorld backbone (implements :class:`cmbench.backbones.base.Backbone`).

    Parameters
    ----------
    config : TinyConfig
    dit : CausalWanDiT, optional
        A built transformer (e.g. while training); a fresh one from ``config`` otherwise.
    """

    def __init__(self, config: TinyConfig, dit: CausalWanDiT | None = None) -> None:
        self.config = config
        self.dit = dit if dit is not None else CausalWanDiT(config.dit, config.rope_spec())
        d = config.dit
        self.geometry = Geometry(
            num_layers=d.num_layers,
            num_heads=d.num_heads,
            head_dim=d.head_dim,
            latent_channels=d.in_channels,
            latent_height=FRAME_SIZE // 2,
            latent_width=FRAME_SIZE // 2,
            rope=self.dit.rope,
            patch=d.patch_size,
            chunk_frames=config.chunk_frames,
        )

    # ----------------------------------------------------------------- weights
    @classmethod
    def random(cls, seed: int = 0, config: TinyConfig | None = None) -> "TinyWorldModel":
        """A seeded random model (the default config unless given), for checks that need no trained weights.

        A fresh DiT starts with zero output-head and camera scale/shift weights (an identity path that
        predicts a constant); those are redrawn so predictions depend on the input, as trained ones do.
        """
        generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = cls(config or default_config())
        with torch.no_grad():
            for p in model.dit.parameters():
                if p.dim() > 1 and not bool(p.any()):
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
        model.dit.eval()
        return model

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, device: str = "cpu") -> "TinyWorldModel":
        """Load weights ``<name>.safetensors`` and their config ``<name>.json``.

        Parameters
        ----------
        path : str or Path, optional
            The ``.safetensors`` file; the committed dynamic-world ``tiny_miniworld_dynamic.safetensors``
            by default.
        device : str
        """
        weights = Path(path) if path is not None else DEFAULT_WEIGHTS
        config_path = weights.with_suffix(".json")
        if not weights.is_file():
            raise ConfigError(f"tiny model weights not found: {weights}")
        if not config_path.is_file():
            raise ConfigError(f"tiny model config not found next to its weights: {config_path}")
        config = TinyConfig.from_dict(json.loads(config_path.read_text()))
        model = cls(config)
        state = load_file(str(weights), device="cpu")
        missing, unexpected = model.dit.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"{weights}: missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}")
        model.dit.to(device).eval()
        return model

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``path`` (safetensors, float32) and the config JSON beside it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.dit.state_dict().items()}
        save_file(state, str(path))
        path.with_suffix(".json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    @property
    def device(self) -> torch.device:
        return self.dit.patch_embedding.weight.device

    # ----------------------------------------------------------------- pixels <-> latents
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Pixels ``uint8 [F, 32, 32, 3]`` -> latents ``float [1, 12, F, 16, 16]`` in [-1, 1]."""
        video = torch.as_tensor(video)
        if video.dim() != 4 or tuple(video.shape[1:]) != (FRAME_SIZE, FRAME_SIZE, 3):
            raise ValueError(f"tiny model frames must be [F, {FRAME_SIZE}, {FRAME_SIZE}, 3], got {tuple(video.shape)}")
        return space_to_depth(video).to(self.device)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[1, 12, F, 16, 16]`` -> pixels ``uint8 [F, 32, 32, 3]``."""
        return depth_to_space(latents.cpu())

    # ----------------------------------------------------------------- conditioning
    def condition(self, task: Any) -> CameraPlan:
        """The camera plan of a MiniWorld task: context offsets followed by the continuation's.

        Reads the row's ``miniworld`` extension (``context_camera_x``, ``continuation_camera_x``,
        ``panorama_width``). Tasks without it (e.g. the official CMBench videos) cannot run on the
        tiny model.
        """
        ext = getattr(task, "extra", {}).get(MINIWORLD_EXTENSION)
        task_id = getattr(task, "task_id", "?")
        if not isinstance(ext, dict) or "context_camera_x" not in ext or "continuation_camera_x" not in ext:
            raise ConfigError(
                f"task {task_id}: the tiny backbone needs MiniWorld camera plans (the row's "
                f"'{MINIWORLD_EXTENSION}' extension); use data=miniworld, or a real backbone for other data"
            )
        width = int(ext.get("panorama_width", self.config.world_width))
        if width != self.config.world_width:
            raise ConfigError(
                f"task {task_id}: panorama width {width} px, but the tiny model was trained for "
                f"{self.config.world_width} px (its world-column RoPE period)"
            )
        return CameraPlan(np.concatenate([np.asarray(ext["context_camera_x"]), np.asarray(ext["continuation_camera_x"])]))

    def camera_poses(self, cond: CameraPlan) -> torch.Tensor:
        """Camera-to-world pose of every latent frame, ``[F, 4, 4]`` float64.

        The MiniWorld camera looks out from the centre of a wrap-around panorama, so a window offset
        ``x`` of a ``W``-px world is a turn about the vertical axis by ``2 pi x / W`` (no translation).
        """
        yaw = torch.as_tensor(cond.camera_x, dtype=torch.float64) * (2 * math.pi / self.config.world_width)
        poses = torch.eye(4, dtype=torch.float64).repeat(len(yaw), 1, 1)
        poses[:, 0, 0], poses[:, 0, 2] = yaw.cos(), yaw.sin()
        poses[:, 2, 0], poses[:, 2, 2] = -yaw.sin(), yaw.cos()
        return poses

    def prefill_key(self, cond: CameraPlan, context_frames: int) -> tuple[int, ...]:
        """The camera offsets of the context frames: all a prefill reads of ``cond``."""
        return tuple(int(x) for x in cond.window(0, context_frames))

    def positions(self, camera_x: np.ndarray, frame_positions: np.ndarray) -> torch.Tensor:
        """RoPE positions of the tokens of some frames.

        Parameters
        ----------
        camera_x : ndarray ``int [F]``
            Window offset of each frame, pixels.
        frame_positions : ndarray ``float [F]``
            Temporal position of each frame (its absolute latent frame index at inference).

        Returns
        -------
        Tensor ``float32 [F * 64, 3]``: (t, row, world column or screen column, see
        :class:`TinyConfig` ``keys``), frame-major, then row, then column.
        """
        g = self.geometry
        screen = np.arange(g.token_cols)[None, :]
        if self.config.keys == "screen":
            cols = np.broadcast_to(screen, (len(camera_x), g.token_cols))
        else:
            cols = (np.asarray(camera_x)[:, None] // TOKEN_PX + screen) % (self.config.world_width // TOKEN_PX)
        f = len(camera_x)
        t = np.broadcast_to(np.asarray(frame_positions, dtype=np.float64)[:, None, None], (f, g.token_rows, g.token_cols))
        h = np.broadcast_to(np.arange(g.token_rows)[None, :, None], (f, g.token_rows, g.token_cols))
        w = np.broadcast_to(cols[:, None, :], (f, g.token_rows, g.token_cols))
        return torch.from_numpy(np.stack([t, h, w], axis=-1).reshape(-1, 3).astype(np.float32))

    def camera_map(self, camera_x: np.ndarray) -> torch.Tensor:
        """Viewing-ray directions on the panorama cylinder, per latent pixel.

        Parameters
        ----------
        camera_x : ndarray ``int [F]``

        Returns
        -------
        Tensor ``float32 [1, 3, F, 16, 16]``: (sin phi, cos phi, elevation).
        """
        lh, lw = self.geometry.latent_height, self.geometry.latent_width
        x = np.asarray(camera_x, dtype=np.float64)[:, None] + 2.0 * np.arange(lw)[None, :] + 1.0
        phi = 2.0 * math.pi * x / self.config.world_width
        elevation = (2.0 * np.arange(lh) + 1.0 - lh) / lh
        f = len(camera_x)
        sin = np.broadcast_to(np.sin(phi)[:, None, :], (f, lh, lw))
        cos = np.broadcast_to(np.cos(phi)[:, None, :], (f, lh, lw))
        ele = np.broadcast_to(elevation[None, :, None], (f, lh, lw))
        return torch.from_numpy(np.stack([sin, cos, ele])[None].astype(np.float32))

    # ----------------------------------------------------------------- the model call
    def predict(
        self,
        x_t: torch.Tensor,
        t: torch.Tensor,
        camera_x: np.ndarray,
        frame_positions: np.ndarray,
        attention: Attention,
    ) -> torch.Tensor:
        """One DiT call on frames with known cameras and temporal positions.

        Parameters
        ----------
        x_t : Tensor ``[B, 12, F, 16, 16]``
        t : Tensor ``[B, F]``
            Noise level of each frame.
        camera_x : ndarray ``int [F]`` or ``[B, F]``
            Window offsets (one plan shared by the batch, or one per sample).
        frame_positions : ndarray ``float [F]`` or ``[B, F]``
            Temporal positions.
        attention : Attention
            The KV cache, or :class:`~cmbench.backbones.dit.BlockCausalAttention` in training.

        Returns
        -------
        Tensor ``[B, 12, F, 16, 16]``: ``x0_hat``.
        """
        b = x_t.shape[0]
        cam = np.asarray(camera_x)
        pos_t = np.asarray(frame_positions)
        if cam.ndim == 1:
            positions = self.positions(cam, np.broadcast_to(pos_t, cam.shape))
            camera = self.camera_map(cam).expand(b, -1, -1, -1, -1)
        else:
            positions = torch.stack([self.positions(c, p) for c, p in zip(cam, np.broadcast_to(pos_t, cam.shape))])
            camera = torch.cat([self.camera_map(c) for c in cam])
        return self.dit(x_t, t, positions.to(x_t.device), attention, camera=camera.to(x_t.device))

    def denoise(
        self, x_t: torch.Tensor, t: float, cache: "KVCache", frame_start: int, cond: CameraPlan
    ) -> torch.Tensor:
        """Predict the clean chunk (the :class:`~cmbench.backbones.base.Backbone` call).

        Parameters
        ----------
        x_t : Tensor ``[B, 12, f, 16, 16]``
        t : float
            Noise level in [0, 1]; ``0`` writes the clean K/V.
        cache : KVCache
        frame_start : int
            Absolute latent frame index of the chunk's first frame.
        cond : CameraPlan

        Returns
        -------
        Tensor ``[B, 12, f, 16, 16]``
        """
        f = x_t.shape[2]
        tt = torch.full((x_t.shape[0], f), float(t), device=x_t.device)
        frames = np.arange(frame_start, frame_start + f, dtype=np.float64)
        return self.predict(x_t, tt, cond.window(frame_start, f), frames, cache)
