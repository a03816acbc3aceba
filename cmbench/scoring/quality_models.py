"""VBench's network quality metrics, each loading its model through transformers (or its optional
package) from a hub id or a local folder; preprocessing as VBench's ``vbench/utils.py`` does it.

| metric | model | VBench's preprocessing |
|---|---|---|
| ``subject_consistency`` | DINO ViT-B/16 (``facebook/dino-vitb16``, ``ViTModel``: the CLS token after the final LayerNorm, as torch.hub's ``dino_vitb16``) | ``dino_transform(224)``: shorter side to 224 (bilinear, no antialiasing), no crop, ``/255``, ImageNet mean / std |
| ``background_consistency`` | CLIP ViT-B/32 (``openai/clip-vit-base-patch32``, ``CLIPVisionModelWithProjection``: ``image_embeds`` = ``encode_image``) | ``clip_transform(224)``: shorter side to 224 (bicubic, no antialiasing), centre crop 224, ``/255``, CLIP mean / std |
| ``aesthetic_quality`` | CLIP ViT-L/14 (``openai/clip-vit-large-patch14``) + LAION's linear head 768 -> 1 (``sa_0_4_vit_l_14_linear.pth``) on the L2-normalised embedding, ``/ 10`` | ``clip_transform(224)`` |
| ``imaging_quality`` | MUSIQ, SPAQ checkpoint (pyiqa's ``MUSIQ``), ``/ 100`` | longer side to 512 when larger (bilinear, no antialiasing), ``/255`` |
| ``motion_smoothness`` | AMT-S (a checkout of MCG-NKU/AMT + ``amt-s.pth``) | frames ``/255``, the half-way frame between each pair of even frames |

The two optional rows raise :class:`~cmbench.scoring.quality.QualityUnavailable` when their package,
code or weights are not here; the column is then absent and the record says why.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cmbench.hashing import file_hash
from cmbench.scoring.imagenet import IMAGENET_MEAN, IMAGENET_STD
from cmbench.scoring.preprocess import upload
from cmbench.scoring.quality import (
    ConsistencyAccumulator,
    MeanAccumulator,
    QualityUnavailable,
    WholeVideoAccumulator,
    motion_smoothness_score,
)
from cmbench.scoring.runtime import Runtime, load_pretrained, model_identity

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
VBENCH_SIZE = 224  # dino_transform(224), clip_transform(224)
MUSIQ_LONGER_SIDE = 512


def shorter_side_size(height: int, width: int, size: int) -> tuple[int, int]:
    """torchvision ``Resize(size)`` with an int: the shorter side to ``size``, the longer to
    ``int(size * long / short)``. Returns (height, width)."""
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def vbench_input(frames: np.ndarray, size: int, mode: str, crop: bool, mean, std, device: torch.device) -> torch.Tensor:
    """VBench's ``dino_transform`` / ``clip_transform`` on a batch.

    Parameters
    ----------
    frames : ndarray, ``uint8 [B, H, W, 3]``
    size : int
        The shorter side after resizing (and the centre crop's side when ``crop``).
    mode : {"bilinear", "bicubic"}
        torchvision's interpolation, without antialiasing, on float pixels.
    crop : bool
        Centre crop ``size x size`` (torchvision's ``CenterCrop``: offsets ``round((H - size) / 2)``).
    mean, std : 3 floats
        Normalisation of ``pixels / 255``.

    Returns
    -------
    Tensor, ``float32 [B, 3, h, w]`` on ``device``
    """
    x = upload(frames, device).float()
    height, width = x.shape[-2:]
    target = shorter_side_size(int(height), int(width), size)
    if target != (height, width):
        x = F.interpolate(x, size=target, mode=mode, align_corners=False, antialias=False)
    if crop:
        top = int(round((target[0] - size) / 2.0))
        left = int(round((target[1] - size) / 2.0))
        x = x[..., top : top + size, left : left + size]
    mean_t = torch.tensor(mean, device=device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=device).view(1, 3, 1, 1)
    return (x / 255.0 - mean_t) / std_t


class _Batched:
    """Runs ``forward(frames) -> float [b, D]`` over a batch ``runtime.batch_size`` frames at a time."""

    runtime: Runtime

    def _batched(self, frames: np.ndarray, forward) -> np.ndarray:
        out = []
        for start in range(0, len(frames), self.runtime.batch_size):
            with torch.inference_mode(), self.runtime.autocast():
                out.append(forward(frames[start : start + self.runtime.batch_size]).float().cpu().numpy())
        return np.concatenate(out)


class SubjectConsistency(_Batched):
    """``subject_consistency``: DINO ViT-B/16 CLS features (module table).

    Parameters
    ----------
    model : str
        Hub id or local folder of a transformers ``ViTModel`` (``facebook/dino-vitb16``).
    runtime : Runtime
    """

    name = "subject_consistency"

    def __init__(self, runtime: Runtime, model: str = "facebook/dino-vitb16"):
        from transformers import ViTModel

        self.runtime = runtime
        self.model = load_pretrained(ViTModel, model, "subject_consistency", add_pooling_layer=False)
        self.model = self.model.to(runtime.device).eval()
        self._identity = model_identity(model, self.model)

    def identity(self) -> dict[str, str]:
        return self._identity

    def features(self, frames: np.ndarray) -> np.ndarray:
        """CLS features of ``uint8 [B, H, W, 3]`` -> ``float32 [B, D]``."""
        def forward(batch: np.ndarray) -> torch.Tensor:
            pixels = vbench_input(batch, VBENCH_SIZE, "bilinear", False, IMAGENET_MEAN, IMAGENET_STD, self.runtime.device)
            return self.model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state[:, 0]

        return self._batched(frames, forward)

    def accumulator(self) -> ConsistencyAccumulator:
        return ConsistencyAccumulator(self.name, self.features)


class _ClipImage(_Batched):
    """A CLIP vision tower with its projection (``image_embeds``, what ``clip.encode_image`` returns)."""

    name: str

    def _load(self, runtime: Runtime, model: str) -> None:
        from transformers import CLIPVisionModelWithProjection

        self.runtime = runtime
        self.model = load_pretrained(CLIPVisionModelWithProjection, model, self.name).to(runtime.device).eval()
        self.image_size = int(self.model.config.image_size)
        self._identity: dict[str, Any] = model_identity(model, self.model)

    def identity(self) -> dict[str, Any]:
        return self._identity

    def embeddings(self, frames: np.ndarray) -> np.ndarray:
        """``image_embeds`` of ``uint8 [B, H, W, 3]`` -> ``float32 [B, P]`` (not normalised)."""
        def forward(batch: np.ndarray) -> torch.Tensor:
            pixels = vbench_input(batch, self.image_size, "bicubic", True, CLIP_MEAN, CLIP_STD, self.runtime.device)
            return self.model(pixel_values=pixels).image_embeds

        return self._batched(frames, forward)


class BackgroundConsistency(_ClipImage):
    """``background_consistency``: CLIP ViT-B/32 image embeddings (module table).

    Parameters
    ----------
    model : str
        Hub id or local folder of a ``CLIPModel`` / ``CLIPVisionModelWithProjection``
        (``openai/clip-vit-base-patch32``); its ``image_size`` (224) is the resize and crop side.
    """

    name = "background_consistency"

    def __init__(self, runtime: Runtime, model: str = "openai/clip-vit-base-patch32"):
        self._load(runtime, model)

    def accumulator(self) -> ConsistencyAccumulator:
        return ConsistencyAccumulator(self.name, self.embeddings)


class AestheticQuality(_ClipImage):
    """``aesthetic_quality``: LAION's linear head on CLIP ViT-L/14 embeddings, ``/ 10`` (module table).

    Parameters
    ----------
    model : str
        ``openai/clip-vit-large-patch14`` or a local folder.
    head : str or None
        Path of the head's state dict (``weight [1, P]``, ``bias [1]``; LAION's
        ``sa_0_4_vit_l_14_linear.pth``). It is on GitHub, not on a model hub: without it the metric
        is absent with that reason.
    """

    name = "aesthetic_quality"

    def __init__(self, runtime: Runtime, model: str = "openai/clip-vit-large-patch14", head: str | None = None):
        if not head:
            raise QualityUnavailable(
                "aesthetic_quality needs LAION's head weights (sa_0_4_vit_l_14_linear.pth from "
                "LAION-AI/aesthetic-predictor): set scorer.quality_settings.aesthetic_quality.head=PATH")
        path = Path(head)
        if not path.is_file():
            raise QualityUnavailable(f"aesthetic_quality: head weights {path} not found")
        self._load(runtime, model)
        state = torch.load(path, map_location="cpu", weights_only=True)
        width = int(self.model.config.projection_dim)
        if set(state) != {"weight", "bias"} or tuple(state["weight"].shape) != (1, width):
            shapes = {k: tuple(v.shape) for k, v in state.items()}
            raise ValueError(f"{path}: expected a linear head's weight [1, {width}] and bias [1], got {shapes}")
        self.head = torch.nn.Linear(width, 1)
        self.head.load_state_dict(state)
        self.head = self.head.to(runtime.device).eval()
        self._identity = {**self._identity, "head": file_hash(path)}

    def scores(self, frames: np.ndarray) -> np.ndarray:
        """``head(normalised embedding) / 10`` per frame of ``uint8 [B, H, W, 3]`` -> ``float [B]``."""
        embeds = torch.from_numpy(self.embeddings(frames)).to(self.runtime.device)
        with torch.inference_mode():
            out = self.head(F.normalize(embeds.float(), dim=-1, p=2)).squeeze(-1) / 10.0
        return out.float().cpu().numpy()

    def accumulator(self) -> MeanAccumulator:
        return MeanAccumulator(self.name, self.scores)


def longer_side_input(frames: np.ndarray, longer: int, device: torch.device) -> torch.Tensor:
    """VBench's imaging-quality ``transform(mode="longer")``: the longer side to ``longer`` when larger
    (bilinear, no antialiasing; ``int(scale * side)``), then ``/255``.

    Parameters
    ----------
    frames : ndarray, ``uint8 [B, H, W, 3]``

    Returns
    -------
    Tensor, ``float32 [B, 3, h, w]`` in [0, 1]
    """
    x = upload(frames, device).float()
    height, width = (int(v) for v in x.shape[-2:])
    if max(height, width) > longer:
        scale = longer / max(height, width)
        x = F.interpolate(x, size=(int(scale * height), int(scale * width)), mode="bilinear", align_corners=False,
                          antialias=False)
    return x / 255.0


def _optional_module(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as err:  # an optional package that is absent or broken (pyiqa needs torchvision)
        raise QualityUnavailable(f"{module} cannot be imported here ({type(err).__name__}: {err}); {extra}") from err


class ImagingQuality:
    """``imaging_quality``: MUSIQ (SPAQ checkpoint) through pyiqa, ``/ 100`` (module table).

    pyiqa needs torchvision, which CMBench's CPU install must not have (README); install the
    ``quality`` extra on a GPU machine. Without pyiqa or the checkpoint the metric is absent.

    Parameters
    ----------
    checkpoint : str or None
        ``musiq_spaq_ckpt-358bb6af.pth`` (pyiqa's release).
    """

    name = "imaging_quality"

    def __init__(self, runtime: Runtime, checkpoint: str | None = None):
        if not checkpoint or not Path(checkpoint).is_file():
            raise QualityUnavailable(
                f"imaging_quality needs MUSIQ's SPAQ checkpoint (musiq_spaq_ckpt-358bb6af.pth): "
                f"{'none given' if not checkpoint else f'{checkpoint} not found'} "
                "(scorer.quality_settings.imaging_quality.checkpoint=PATH)")
        arch = _optional_module("pyiqa.archs.musiq_arch", "install the quality extra: pip install 'cmbench[quality]' "
                                "(pyiqa needs a working torchvision)")
        self.runtime = runtime
        self.model = arch.MUSIQ(pretrained_model_path=str(checkpoint)).to(runtime.device).eval()
        self._identity = {"checkpoint": file_hash(Path(checkpoint))}

    def identity(self) -> dict[str, str]:
        return self._identity

    def scores(self, frames: np.ndarray) -> np.ndarray:
        """MUSIQ / 100 per frame of ``uint8 [B, H, W, 3]``, one frame per call as VBench does."""
        out = []
        with torch.inference_mode():
            for frame in frames:
                pixels = longer_side_input(frame[None], MUSIQ_LONGER_SIDE, self.runtime.device)
                out.append(float(self.model(pixels)) / 100.0)
        return np.asarray(out)

    def accumulator(self) -> MeanAccumulator:
        return MeanAccumulator(self.name, self.scores)


class MotionSmoothness:
    """``motion_smoothness``: AMT-S re-interpolates the odd frames (module table,
    :func:`~cmbench.scoring.quality.motion_smoothness_score`).

    AMT is not a package: ``amt_root`` is a checkout of MCG-NKU/AMT (trusted like code: a config
    names it), whose ``utils.build_utils.build_from_cfg`` builds the network from ``config``
    (``cfgs/AMT-S.yaml``); ``checkpoint`` is ``amt-s.pth`` (``state_dict``). Without them the metric
    is absent with that reason.
    """

    name = "motion_smoothness"

    def __init__(self, runtime: Runtime, amt_root: str | None = None, config: str | None = None,
                 checkpoint: str | None = None):
        missing = [f"{key}" for key, value in (("amt_root", amt_root), ("config", config), ("checkpoint", checkpoint))
                   if not value or not Path(value).exists()]
        if missing:
            raise QualityUnavailable(
                "motion_smoothness needs AMT-S: a checkout of MCG-NKU/AMT, cfgs/AMT-S.yaml and amt-s.pth "
                f"(scorer.quality_settings.motion_smoothness.{', .'.join(missing)} not given or not found)")
        from omegaconf import OmegaConf

        root = str(Path(str(amt_root)).resolve())
        if root not in sys.path:
            sys.path.insert(0, root)
        build = _optional_module("utils.build_utils", f"{root} is not a checkout of MCG-NKU/AMT")
        self.runtime = runtime
        self.model = build.build_from_cfg(OmegaConf.load(str(config)).network)
        state = torch.load(str(checkpoint), map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["state_dict"])
        self.model = self.model.to(runtime.device).eval()
        self._identity = {"checkpoint": file_hash(Path(str(checkpoint))), "config": file_hash(Path(str(config)))}

    def identity(self) -> dict[str, str]:
        return self._identity

    def interpolate(self, before: np.ndarray, after: np.ndarray) -> np.ndarray:
        """AMT's frame half-way between ``before`` and ``after`` (``uint8 [N, H, W, 3]`` each), rounded
        to uint8 as VBench does."""
        device = self.runtime.device
        out = []
        embt = torch.full((1, 1, 1, 1), 0.5, device=device)
        with torch.inference_mode():
            for a, b in zip(before, after):
                pa, pb = (upload(x[None], device).float() / 255.0 for x in (a, b))
                pred = self.model(pa, pb, embt, scale_factor=1.0, eval=True)["imgt_pred"]
                out.append((pred.clamp(0, 1) * 255.0).round().byte().permute(0, 2, 3, 1).cpu().numpy()[0])
        return np.stack(out)

    def accumulator(self) -> WholeVideoAccumulator:
        return WholeVideoAccumulator(lambda frames: motion_smoothness_score(frames, self.interpolate))

