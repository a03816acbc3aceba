"""Batched image preprocessing on the models' device, with the arithmetic of transformers' processors.

Frames arrive as ``uint8 [B, H, W, 3]`` arrays. They are uploaded once, as uint8, and every step
after that (resize, centre crop, pad, normalise) is a batched torch op on the device the model runs
on, so a GPU never waits for one-image-at-a-time host preprocessing. (The one host step is the
blanking of DINOv2's crops outside their masks, :func:`blank_outside`: a single OpenCV pass per crop,
before its upload.)

The reference each step reproduces (``tests/test_scoring_preprocess.py`` pins the agreement):

- **resize** (:func:`resize_uint8`): PIL's antialiased bilinear / bicubic filters (bicubic with
  ``a = -0.5``), the result rounded to uint8 as PIL and torchvision return it. This is what the
  OWL-ViT and DINOv2 (``BitImageProcessor``) processors do (PIL backend: ``Image.resize``;
  torchvision backend: ``resize(antialias=True)``, which matches PIL) and what SAM 2's
  ``Sam2ImageProcessor`` does (torchvision, bilinear, ``antialias=True``). On CPU it runs torch's
  uint8 kernel, elsewhere float32 then rounding; both are within one grey level of PIL.
- **OWLv2** (:class:`Owlv2Spec`): rescale to [0, 1], pad bottom / right to a square with 0,
  Gaussian blur with sigma ``(factor - 1) / 2`` (scipy's ``gaussian_filter``, truncated at 4 sigma,
  mirror boundary), linear zoom (scipy's ``zoom(order=1, grid_mode=True)``, mirror boundary), clip to
  the padded input's range, normalise (``Owlv2ImageProcessor``). Blur and zoom are one linear map
  per axis, applied as two batched matrix products.
- **normalise**: ``(x / 255 - mean) / std`` in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from cmbench.scoring.imagenet import IMAGENET_MEAN, IMAGENET_STD

# PIL resampling codes (PIL.Image.Resampling) that the processors in use name
_RESAMPLE = {2: "bilinear", 3: "bicubic"}


def upload(frames: np.ndarray, device: torch.device) -> torch.Tensor:
    """Frames to the device as uint8, channels first.

    Parameters
    ----------
    frames : ndarray, ``uint8 [B, H, W, 3]``
    device : torch.device

    Returns
    -------
    Tensor, ``uint8 [B, 3, H, W]`` (a channels-last view: no copy on the host for a contiguous array)
    """
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [B, H, W, 3], got {frames.dtype} {frames.shape}")
    return torch.from_numpy(np.ascontiguousarray(frames)).to(device, non_blocking=True).permute(0, 3, 1, 2)


def resize_uint8(images: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """Antialiased resize with PIL's filters, rounded to uint8.

    Parameters
    ----------
    images : Tensor, ``uint8 [B, C, H, W]``
    size : (height, width)
    mode : {"bilinear", "bicubic"}

    Returns
    -------
    Tensor, ``uint8 [B, C, height, width]`` (``images`` itself when the size already matches)
    """
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    if images.device.type == "cpu":  # torch's uint8 kernel (the one torchvision matches to PIL)
        return F.interpolate(images, size=size, mode=mode, antialias=True)
    return resize_two_pass(images, size, mode)


def resize_two_pass(images: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """:func:`resize_uint8` in float32 for devices without torch's uint8 kernel (CUDA).

    PIL resizes the width first, rounds and clips to uint8, then resizes the height; a single 2-D
    float pass skips the intermediate clip and differs by up to ~25 grey levels where bicubic
    overshoots, so this keeps the two passes.

    Parameters
    ----------
    images : Tensor, ``uint8 [B, C, H, W]``
    size : (height, width)
    mode : {"bilinear", "bicubic"}

    Returns
    -------
    Tensor, ``uint8 [B, C, height, width]``
    """
    out = images.float()
    for step in ((images.shape[-2], size[1]), tuple(size)):
        if tuple(out.shape[-2:]) != tuple(step):
            out = F.interpolate(out, size=step, mode=mode, antialias=True, align_corners=False).round_().clamp_(0, 255)
    return out.to(torch.uint8)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x / 255 - mean) / std`` per channel, into a new tensor (``images`` is left as it is).

    Parameters
    ----------
    images : Tensor, ``[B, 3, H, W]`` on the 0..255 scale (uint8 or float, any memory layout)
    mean, std : 3 floats each

    Returns
    -------
    Tensor, ``float32 [B, 3, H, W]``, contiguous
    """
    return normalize_(images.to(torch.float32, memory_format=torch.contiguous_format, copy=True), mean, std)


def normalize_(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """:func:`normalize` in place, for a tensor the caller made and no one else holds (no second copy of a batch).

    Parameters
    ----------
    images : Tensor, ``float32 [B, 3, H, W]`` on the 0..255 scale, contiguous; overwritten
    mean, std : 3 floats each

    Returns
    -------
    Tensor, ``images``
    """
    shift = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1) * 255.0
    scale = 1.0 / (torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1) * 255.0)
    return images.sub_(shift).mul_(scale)


def center_crop(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Centre crop as transformers does it: offsets ``(H - h) // 2`` and ``(W - w) // 2``; an image
    smaller than the crop is first zero-padded around its centre (``ceil`` of half the missing size on
    the top / left).

    Parameters
    ----------
    images : Tensor, ``[B, C, H, W]``
    size : (height, width)

    Returns
    -------
    Tensor, ``[B, C, height, width]``
    """
    height, width = images.shape[-2:]
    crop_h, crop_w = size
    if crop_h > height or crop_w > width:
        top = -(-(max(crop_h, height) - height) // 2)
        left = -(-(max(crop_w, width) - width) // 2)
        canvas = images.new_zeros((*images.shape[:-2], max(crop_h, height), max(crop_w, width)))
        canvas[..., top : top + height, left : left + width] = images
        images, height, width = canvas, canvas.shape[-2], canvas.shape[-1]
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    return images[..., top : top + crop_h, left : left + crop_w]


def _size_field(size: Any, key: str) -> int | None:
    """A field of a processor's ``size`` / ``crop_size`` (a dict in transformers 4, a SizeDict in 5)."""
    if size is None:
        return None
    value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    return None if value is None else int(value)


@dataclass(frozen=True)
class ImageSpec:
    """Resize -> centre crop -> normalise, the pipeline of CLIP-style image processors.

    Attributes
    ----------
    size : (height, width) or None
        Exact output size of the resize (OWL-ViT, SAM 2).
    shortest_edge : int or None
        Resize so the shorter side has this length, the longer ``int(edge * long / short)`` (DINOv2).
    resample : {"bilinear", "bicubic"}
    crop : (height, width) or None
        Centre crop after the resize.
    mean, std : 3 floats each
    """

    size: tuple[int, int] | None
    shortest_edge: int | None
    resample: str
    crop: tuple[int, int] | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __post_init__(self):
        if (self.size is None) == (self.shortest_edge is None):
            raise ValueError("an ImageSpec resizes to exactly one of size or shortest_edge")
        if self.resample not in _RESAMPLE.values():
            raise ValueError(f"resample must be one of {sorted(_RESAMPLE.values())}, got {self.resample!r}")

    @classmethod
    def from_processor(cls, processor: Any, where: str) -> ImageSpec:
        """Read a transformers image processor's settings (OWL-ViT, BiT / DINOv2, CLIP style).

        Parameters
        ----------
        processor : a transformers image processor (PIL or torchvision backend)
        where : str
            Names the model folder in error messages.

        Raises
        ------
        ValueError
            When the processor does something this spec does not reproduce.
        """
        if not getattr(processor, "do_resize", True):
            raise ValueError(f"{where}: image processors without do_resize are not supported")
        if not (getattr(processor, "do_rescale", True) and getattr(processor, "do_normalize", True)):
            raise ValueError(f"{where}: the image processor must rescale and normalise")
        factor = float(getattr(processor, "rescale_factor", 1 / 255))
        if abs(factor * 255.0 - 1.0) > 1e-6:
            raise ValueError(f"{where}: rescale_factor {factor} is not 1/255")
        resample = _RESAMPLE.get(int(getattr(processor, "resample", 2)))
        if resample is None:
            raise ValueError(f"{where}: resample={processor.resample!r} is not bilinear (2) or bicubic (3)")
        height, width = _size_field(processor.size, "height"), _size_field(processor.size, "width")
        shortest = _size_field(processor.size, "shortest_edge")
        crop = None
        if getattr(processor, "do_center_crop", False):
            crop = (_size_field(processor.crop_size, "height"), _size_field(processor.crop_size, "width"))
        return cls(
            size=(height, width) if height and width else None,
            shortest_edge=None if height and width else shortest,
            resample=resample,
            crop=crop,  # type: ignore[arg-type]
            mean=tuple(float(v) for v in processor.image_mean),  # type: ignore[arg-type]
            std=tuple(float(v) for v in processor.image_std),  # type: ignore[arg-type]
        )

    @classmethod
    def sam2(cls, side: int) -> ImageSpec:
        """``Sam2ImageProcessor``: bilinear (antialiased) to ``side x side``, ImageNet mean / std."""
        return cls(size=(side, side), shortest_edge=None, resample="bilinear", crop=None, mean=IMAGENET_MEAN, std=IMAGENET_STD)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """Output size of the resize step for an ``height x width`` image."""
        if self.size is not None:
            return self.size
        edge = int(self.shortest_edge)  # type: ignore[arg-type]
        if height <= width:
            return edge, int(edge * width / height)
        return int(edge * height / width), edge

    def resize_crop(self, images: torch.Tensor) -> torch.Tensor:
        """Resize and centre crop: ``uint8 [B, 3, H, W]`` -> ``uint8 [B, 3, h, w]``."""
        out = resize_uint8(images, self.resized_size(*images.shape[-2:]), self.resample)
        return center_crop(out, self.crop) if self.crop is not None else out

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``uint8 [B, 3, H, W]`` -> model input ``float32 [B, 3, h, w]``."""
        return normalize(self.resize_crop(images), self.mean, self.std)

    def batch(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Images of different sizes (``uint8 [3, H_i, W_i]``) to one batch ``float32 [N, 3, h, w]``;
        the spec must crop or resize to a fixed size."""
        if self.crop is None and self.size is None:
            raise ValueError("batching images of different sizes needs a fixed output size (crop or size)")
        return normalize(torch.cat([self.resize_crop(image[None]) for image in images]), self.mean, self.std)


def frames_input(spec: ImageSpec | Owlv2Spec, frames: np.ndarray | Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    """Model input of frames: one upload and one batched pass for an array of equal frames; frame by
    frame (no host-side stacking) for a sequence, whose frames may differ in size.

    Parameters
    ----------
    spec : ImageSpec or Owlv2Spec
    frames : ``uint8 [B, H, W, 3]`` array, or a sequence of ``uint8 [H_i, W_i, 3]``
    device : torch.device

    Returns
    -------
    Tensor, ``float32 [B, 3, h, w]`` on ``device``
    """
    if isinstance(frames, np.ndarray):
        return spec(upload(frames, device))
    if isinstance(spec, Owlv2Spec):
        return torch.cat([spec(upload(f[None], device)) for f in frames])
    return spec.batch([upload(f[None], device)[0] for f in frames])


def masked_crops_input(
    spec: ImageSpec,
    crops: Sequence[np.ndarray],
    masks: Sequence[np.ndarray],
    background: int,
    square: bool,
    device: torch.device,
) -> torch.Tensor:
    """Model input of masked crops: pixels outside the mask set to ``background`` on the host
    (:func:`blank_outside`), optionally padded to a centred square of ``background`` on the device
    (:func:`pad_square`), then ``spec``.

    Parameters
    ----------
    spec : ImageSpec
        With a fixed output size.
    crops : sequence of ``uint8 [h_i, w_i, 3]``
    masks : sequence of ``bool [h_i, w_i]``
    background : int
        0..255.
    square : bool
    device : torch.device

    Returns
    -------
    Tensor, ``float32 [N, 3, s, s]`` on ``device``
    """
    images = []
    for crop, mask in zip(crops, masks):
        pixels = upload(blank_outside(crop, mask, background)[None], device)[0]
        images.append(pad_square(pixels, background) if square else pixels)
    return spec.batch(images)


def blank_outside(crop: np.ndarray, mask: np.ndarray, background: int) -> np.ndarray:
    """The crop's pixels inside ``mask``, ``background`` outside, on the host.

    OpenCV's masked copy does it in one pass; a broadcast multiply of ``[h, w, 3]`` by ``[h, w, 1]``
    (numpy or torch on a CPU) does not vectorise over the 3-channel innermost axis and took about 10x
    longer, as long as the crop's resize.

    Parameters
    ----------
    crop : ndarray, ``uint8 [h, w, 3]`` (may be a strided view into a frame)
    mask : ndarray, ``bool [h, w]``
    background : int
        0..255.

    Returns
    -------
    ndarray, ``uint8 [h, w, 3]``, a new array
    """
    if mask.shape != crop.shape[:2]:
        raise ValueError(f"mask shape {mask.shape} does not match the crop's {crop.shape[:2]}")
    canvas = np.full(crop.shape, background, dtype=np.uint8)
    return cv2.copyTo(crop, np.ascontiguousarray(mask).view(np.uint8), canvas)


def pad_square(image: torch.Tensor, background: int) -> torch.Tensor:
    """Pad ``uint8 [3, h, w]`` to a centred square of side ``max(h, w)`` filled with ``background``
    (the extra row / column goes to the bottom / right)."""
    _, height, width = image.shape
    side = max(height, width)
    square = image.new_full((3, side, side), background)
    top, left = (side - height) // 2, (side - width) // 2
    square[:, top : top + height, left : left + width] = image
    return square


def _mirror(index: np.ndarray, n: int) -> np.ndarray:
    """scipy.ndimage's ``mirror`` boundary (reflect about the edge samples: d c b | a b c d | c b a)."""
    if n == 1:
        return np.zeros_like(index)
    period = 2 * (n - 1)
    index = np.mod(index, period)
    return np.where(index >= n, period - index, index)


@functools.lru_cache(maxsize=16)
def owlv2_axis_operator(n_in: int, n_out: int) -> np.ndarray:
    """The linear map of OWLv2's resize along one axis: Gaussian anti-aliasing then linear zoom.

    Sigma is ``max(0, (n_in / n_out - 1) / 2)``; the Gaussian is truncated at ``int(4 sigma + 0.5)``
    and both steps use scipy's ``mirror`` boundary; the zoom samples input coordinate
    ``(j + 0.5) * n_in / n_out - 0.5`` (``grid_mode=True``).

    Returns
    -------
    ndarray, ``float64 [n_out, n_in]``
    """
    sigma = max(0.0, (n_in / n_out - 1.0) / 2.0)
    blur = np.eye(n_in)
    if sigma > 0:
        radius = int(4.0 * sigma + 0.5)
        taps = np.arange(-radius, radius + 1)
        weights = np.exp(-0.5 * (taps / sigma) ** 2)
        weights /= weights.sum()
        blur = np.zeros((n_in, n_in))
        rows = np.arange(n_in)
        for tap, weight in zip(taps, weights):
            np.add.at(blur, (rows, _mirror(rows + tap, n_in)), weight)
    coord = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    low = np.floor(coord).astype(np.int64)
    frac = coord - low
    zoom = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    np.add.at(zoom, (rows, _mirror(low, n_in)), 1.0 - frac)
    np.add.at(zoom, (rows, _mirror(low + 1, n_in)), frac)
    return zoom @ blur


@dataclass(frozen=True)
class Owlv2Spec:
    """``Owlv2ImageProcessor``: pad to a square, anti-aliased linear resize, clip, normalise.

    Attributes
    ----------
    size : (height, width)
    mean, std : 3 floats each
    """

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_processor(cls, processor: Any, where: str) -> Owlv2Spec:
        """Read an OWLv2 image processor's settings (``where`` names the model in errors)."""
        if not (getattr(processor, "do_pad", True) and getattr(processor, "do_resize", True)):
            raise ValueError(f"{where}: OWLv2 processors without padding or resizing are not supported")
        height, width = _size_field(processor.size, "height"), _size_field(processor.size, "width")
        if not (height and width):
            raise ValueError(f"{where}: the OWLv2 processor needs size height and width, got {processor.size}")
        return cls(
            size=(height, width),
            mean=tuple(float(v) for v in processor.image_mean),  # type: ignore[arg-type]
            std=tuple(float(v) for v in processor.image_std),  # type: ignore[arg-type]
        )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``uint8 [B, 3, H, W]`` -> model input ``float32 [B, 3, height, width]``.

        The bottom / right padding is zeros, so the operators' padded columns are dropped and the
        products run on the unpadded frames.
        """
        height, width = images.shape[-2:]
        side = max(height, width)
        device = images.device
        rows = torch.from_numpy(owlv2_axis_operator(side, self.size[0])[:, :height]).float().to(device)
        cols = torch.from_numpy(owlv2_axis_operator(side, self.size[1])[:, :width]).float().to(device)
        pixels = images.float() / 255.0
        out = rows @ (pixels @ cols.T)  # [B, 3, size_h, size_w]
        flat = pixels.flatten(1)
        low, high = flat.amin(dim=1), flat.amax(dim=1)
        if height != width:  # the zero padding is part of the clipped range
            low, high = low.clamp(max=0.0), high.clamp(min=0.0)
        out = torch.maximum(torch.minimum(out, high.view(-1, 1, 1, 1)), low.view(-1, 1, 1, 1))
        return normalize_(out * 255.0, self.mean, self.std)
