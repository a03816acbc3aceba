"""Contact sheet of one MiniWorld task: its scene, camera path, context clips and continuation plan.

Usage::

    python scripts/miniworld_contact_sheet.py                       # syn_001_revisit_01
    python scripts/miniworld_contact_sheet.py --task real_002_reappear_01 \
        --out docs/img/miniworld_contact_sheet_real.png

Reads the suite at ``--root`` (building it with ``configs/data/miniworld.yaml`` if it is missing).
Frame borders: green = the target is visible, yellow = the reference frame, red = the recent window
(last 8 context frames), grey = otherwise. Continuation frames show the target's true box.
"""

from __future__ import annotations

import argparse
import io
import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from PIL import Image  # noqa: E402

from cmbench.config_paths import CONFIG_DIR  # noqa: E402
from cmbench.miniworld import build_suite, object_masks, scene_from_seed, visible_fraction  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCALE = 3  # pixel upscaling of frames
STRIDE = 2  # show every STRIDE-th context frame
COLOURS = {"visible": (40, 200, 60), "reference": (250, 210, 0), "recent": (220, 40, 40), "other": (150, 150, 150)}


def _tile(frame: np.ndarray, colour: tuple[int, int, int], box: np.ndarray | None = None) -> np.ndarray:
    """Upscale a ``uint8 [32, 32, 3]`` frame and frame it with a 2-px border (and a 1-px target box)."""
    big = np.repeat(np.repeat(frame, SCALE, 0), SCALE, 1).copy()
    if box is not None and not np.isnan(box).any():
        x0, y0, x1, y1 = (np.asarray(box) * 32 * SCALE).astype(int)
        x1, y1 = min(x1, big.shape[1]) - 1, min(y1, big.shape[0]) - 1
        big[y0 : y1 + 1, [x0, x1]] = COLOURS["reference"]
        big[[y0, y1], x0 : x1 + 1] = COLOURS["reference"]
    return np.pad(big, ((2, 2), (2, 2), (0, 0)), constant_values=0) + _border(big.shape[0] + 4, colour)


def _border(size: int, colour: tuple[int, int, int]) -> np.ndarray:
    out = np.zeros((size, size, 3), np.uint8)
    out[:2], out[-2:], out[:, :2], out[:, -2:] = colour, colour, colour, colour
    return out


def _strip(tiles: list[np.ndarray]) -> np.ndarray:
    gap = np.full((tiles[0].shape[0], 2, 3), 255, np.uint8)
    return np.concatenate([t for tile in tiles for t in (tile, gap)][:-1], axis=1)


def load_task(root: Path, task_id: str) -> dict:
    for line in (root / "metadata.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["task_id"] == task_id:
            return row
    raise SystemExit(f"task {task_id} not in {root / 'metadata.jsonl'}")


def contact_sheet(root: Path, task_id: str, out: Path) -> Path:
    row = load_task(root, task_id)
    ext = row["miniworld"]
    scene = scene_from_seed(ext["scene_seed"], row["type"], ext["panorama_width"])
    target = ext["target_object_id"]
    context = np.load(root / ext["context_frames"])
    truth = np.load(root / ext["ground_truth"])
    cams, frames = context["camera_x"], context["frames"]
    plan = truth["camera_x"]
    seen = object_masks(scene, cams, target).any(axis=(1, 2))
    ref = row["references"][0]["frame_index"]
    clip_frames, n = ext["clip_frames"], len(cams)

    fig = plt.figure(figsize=(14, 17.5), dpi=80)
    grid = fig.add_gridspec(9, 1, height_ratios=[0.9, 1.6, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.3], hspace=0.6, top=0.93)
    title = f"{task_id}  ({row['type']}, {row['task_type']})   target: {ext['target_description']}"
    fig.suptitle(title + f"\ncontinue prompt: {row['continue_prompt']}", fontsize=13, y=0.995)

    ax = fig.add_subplot(grid[0])
    ax.imshow(scene.panorama, interpolation="nearest")
    obj = scene.objects[target]
    ax.add_patch(Rectangle((obj.x - 1.5, obj.y - 1.5), obj.size + 2, obj.size + 2, fill=False, ec="yellow", lw=2))
    for twin in ext["distractor_object_ids"]:
        o = scene.objects[twin]
        ax.add_patch(Rectangle((o.x - 1.5, o.y - 1.5), o.size + 2, o.size + 2, fill=False, ec="white", lw=1.5, ls="--"))
    ax.set_title(f"panorama ({scene.background}); target boxed yellow, same-category distractor dashed", fontsize=10)
    ax.set_yticks([])

    ax = fig.add_subplot(grid[1])
    t = np.arange(n + len(plan))
    path = np.concatenate([cams, plan])
    visible = visible_fraction(scene, path)[:, target] > 0
    ax.scatter(t[~visible], path[~visible], s=6, c="grey", label="camera offset")
    ax.scatter(t[visible], path[visible], s=10, c="green", label="target in view")
    ax.axvspan(0, ext.get("sink_frames", 4), color="blue", alpha=0.12, label="sink (4 frames)")
    ax.axvspan(n - 8, n, color="red", alpha=0.15, label="recent window (8 frames)")
    ax.axvspan(n, n + len(plan), color="orange", alpha=0.15, label="continuation plan")
    for c in range(1, n // clip_frames):
        ax.axvline(c * clip_frames, color="k", lw=0.5, ls=":")
    ax.set(xlim=(0, n + len(plan)), ylim=(0, scene.width), xlabel="frame", ylabel="camera x (px)")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=8, ncol=5, frameon=False)

    for c, prompt in enumerate(p["clip_prompt"] for p in row["context_clip_prompts"]):
        ax = fig.add_subplot(grid[2 + c])
        tiles = []
        for f in range(c * clip_frames, (c + 1) * clip_frames, STRIDE):
            f = ref if f <= ref < f + STRIDE else f  # the reference frame is always shown
            kind = "reference" if f == ref else "recent" if f >= n - 8 else "visible" if seen[f] else "other"
            tiles.append(_tile(frames[f], COLOURS[kind]))
        ax.imshow(_strip(tiles))
        ax.set_axis_off()
        label = f"clip {c + 1} (frames {c * clip_frames}-{(c + 1) * clip_frames - 1}, every {STRIDE}nd): "
        label += "[reference frame in yellow] " if c * clip_frames <= ref < (c + 1) * clip_frames else ""
        ax.set_title("\n".join(textwrap.wrap(label + prompt, 190)), fontsize=8.5, loc="left")

    ax = fig.add_subplot(grid[8])
    tiles = [
        _tile(frame, COLOURS["visible"] if mask.any() else COLOURS["other"], box)
        for frame, mask, box in zip(truth["frames"], truth["target_masks"], truth["target_boxes"])
    ]
    ax.imshow(_strip(tiles))
    ax.set_axis_off()
    ax.set_title(f"ground-truth continuation (frames {n}-{n + len(plan) - 1}, all), target box in yellow", fontsize=9, loc="left")

    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    # a 256-colour palette keeps the picture small enough for the repository
    Image.open(buffer).convert("RGB").quantize(colors=256).save(out, optimize=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO / "data" / "miniworld", help="suite root (built if missing)")
    parser.add_argument("--task", default="syn_001_revisit_01", help="task id")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "miniworld_contact_sheet.png")
    args = parser.parse_args()
    cfg = OmegaConf.load(CONFIG_DIR / "data" / "miniworld.yaml")
    cfg.root = str(args.root)
    root = build_suite(cfg)
    print(contact_sheet(root, args.task, args.out))


if __name__ == "__main__":
    main()
