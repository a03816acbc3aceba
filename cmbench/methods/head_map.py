"""Static / dynamic head maps in ForcingKV's JSON format, and the paper's rule that builds them.

Format::

    {"num_layers": L, "num_heads": H,
     "layers": [{"layer_idx": 0, "static_head": [...], "dynamic_head": [...]}, ...]}

Every layer appears once and its two lists partition ``0 .. H-1``. Extra top-level keys (e.g.
``threshold``, ``scores``) are kept as metadata.

Rule (DeCoPrune-HS, from ForcingKV): with FullKV attention at the first continuation denoising call,
``s(l, h)`` = attention mass on the last ``last`` context latent frames divided by the mass on all
context frames except the first ``first``; a head is static iff ``s >= threshold`` (0.8), and the
listed ``dynamic_layers`` (layer 0) are all dynamic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from cmbench.cache import HeadGroup
from cmbench.errors import ConfigError


@dataclass(frozen=True)
class HeadMap:
    """Which heads of each layer are static.

    Attributes
    ----------
    num_layers, num_heads : int
    static : tuple of tuple of int
        Static heads per layer (sorted); the rest are dynamic.
    meta : dict
        Extra keys of the JSON file.
    """

    num_layers: int
    num_heads: int
    static: tuple[tuple[int, ...], ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def dynamic(self, layer: int) -> tuple[int, ...]:
        return tuple(h for h in range(self.num_heads) if h not in set(self.static[layer]))

    @property
    def num_static(self) -> int:
        return sum(len(s) for s in self.static)

    def to_json(self) -> dict[str, Any]:
        layers = [
            {"layer_idx": i, "static_head": list(self.static[i]), "dynamic_head": list(self.dynamic(i))}
            for i in range(self.num_layers)
        ]
        return {"num_layers": self.num_layers, "num_heads": self.num_heads, "layers": layers, **self.meta}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "head map") -> "HeadMap":
        """Validate and parse; raises :class:`ConfigError` naming the problem."""
        try:
            num_layers, num_heads, layers = int(data["num_layers"]), int(data["num_heads"]), data["layers"]
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{where}: needs integer num_layers, num_heads and a layers list ({err})") from err
        static: dict[int, tuple[int, ...]] = {}
        for row in layers:
            try:
                i, st, dyn = int(row["layer_idx"]), [int(h) for h in row["static_head"]], [int(h) for h in row["dynamic_head"]]
            except (KeyError, TypeError, ValueError) as err:
                raise ConfigError(f"{where}: each layer needs layer_idx, static_head, dynamic_head ({err})") from err
            if not 0 <= i < num_layers or i in static:
                raise ConfigError(f"{where}: layer_idx {i} is out of range or repeated")
            if sorted(st + dyn) != list(range(num_heads)):
                raise ConfigError(f"{where}: layer {i}: static_head + dynamic_head must partition 0..{num_heads - 1}")
            static[i] = tuple(sorted(st))
        if len(static) != num_layers:
            raise ConfigError(f"{where}: {num_layers} layers declared, {len(static)} listed")
        meta = {k: v for k, v in data.items() if k not in ("num_layers", "num_heads", "layers")}
        return cls(num_layers, num_heads, tuple(static[i] for i in range(num_layers)), meta)

    @classmethod
    def load(cls, path: str | Path) -> "HeadMap":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"head map file {path} does not exist")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"head map {path} is not valid JSON: {err}") from err
        return cls.from_json(data, str(path))

    @classmethod
    def load_for(cls, path: str | None, geometry, who: str) -> "HeadMap":
        """Load and check it matches ``geometry``'s layers and heads; ``who`` names the method in errors."""
        if not path:
            raise ConfigError(f"{who} needs head_map=<path to a head-map JSON>, and this backbone has none: build one on "
                              f"a GPU from 15 calibration videos with `python scripts/build_head_map.py --out "
                              f"head_map.json --contexts 15 backbone=<backbone> data.root=<calibration videos>`, then "
                              f"pass method.head_map=head_map.json (docs/methods.md, 'Head maps')")
        hmap = cls.load(path)
        if (hmap.num_layers, hmap.num_heads) != (geometry.num_layers, geometry.num_heads):
            raise ConfigError(
                f"head map {path} is for {hmap.num_layers}x{hmap.num_heads} layer-heads, the backbone has "
                f"{geometry.num_layers}x{geometry.num_heads}"
            )
        return hmap

    def layout(self, dynamic_size: int | None, static_size: int | None,
               dynamic_layers: Sequence[int] = ()) -> list[list[HeadGroup]]:
        """Per layer a ``"dynamic"`` bank and (if any) a ``"static"`` bank with these configured sizes."""
        out = []
        for layer in range(self.num_layers):
            static = () if layer in dynamic_layers else self.static[layer]
            dynamic = tuple(h for h in range(self.num_heads) if h not in static)
            groups = [HeadGroup(dynamic, "dynamic", dynamic_size)] if dynamic else []
            if static:
                groups.append(HeadGroup(static, "static", static_size))
            out.append(groups)
        return out

    def with_static_layer(self, layer: int) -> "HeadMap":
        """This map with every head of ``layer`` static."""
        static = tuple(tuple(range(self.num_heads)) if i == layer else s for i, s in enumerate(self.static))
        return replace(self, static=static)

    @classmethod
    def all_dynamic(cls, num_layers: int, num_heads: int) -> "HeadMap":
        """A map without static heads."""
        return cls(num_layers, num_heads, ((),) * num_layers)

    @classmethod
    def from_scores(cls, scores: torch.Tensor, threshold: float = 0.8,
                    dynamic_layers: Sequence[int] = (0,), **meta: Any) -> "HeadMap":
        """Static iff ``scores[l, h] >= threshold``; ``dynamic_layers`` all dynamic.

        Parameters
        ----------
        scores : Tensor, shape ``[num_layers, num_heads]``
            ``s(l, h)`` from :func:`static_scores` (non-finite scores count as dynamic).
        """
        n_layers, n_heads = scores.shape
        static = []
        for layer in range(n_layers):
            row = scores[layer]
            is_static = torch.isfinite(row) & (row >= threshold)
            static.append(() if layer in dynamic_layers else tuple(int(h) for h in is_static.nonzero().flatten()))
        return cls(n_layers, n_heads, tuple(static), {"threshold": threshold, **meta})


def static_masses(mass: torch.Tensor, context_frames: int, first: int = 4,
                  last: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """The two sides of ``s(l, h)``: mass on the last ``last`` context frames, and on frames ``first ..``.

    Parameters
    ----------
    mass : Tensor, shape ``[num_layers, num_heads, F]``
        Attention mass per absolute latent frame (:class:`AttentionStats` stacked), ``F > context_frames``
        allowed (frames from ``context_frames`` on are the continuation and are ignored).
    context_frames : int
        ``q0``; needs ``q0 > first`` and ``q0 >= last``.

    Returns
    -------
    (numerator, denominator), each ``[num_layers, num_heads]``.
    """
    if context_frames <= first or context_frames < last:
        raise ConfigError(f"head scores need more than {first} context frames (and at least {last}), got {context_frames}")
    return mass[..., context_frames - last : context_frames].sum(-1), mass[..., first:context_frames].sum(-1)


def static_scores(mass: torch.Tensor, context_frames: int, first: int = 4, last: int = 4) -> torch.Tensor:
    """``s(l, h)`` = mass on the last ``last`` context frames / mass on context frames ``first ..``
    (:func:`static_masses`); ``[num_layers, num_heads]``, ``nan`` where the denominator is zero."""
    return ratio(*static_masses(mass, context_frames, first, last))


def ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, ``nan`` where the denominator is zero."""
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1e-30), torch.full_like(numerator, float("nan")))
