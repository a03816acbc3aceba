"""GPU check of the paper's scorer with real weights (no download): controls, fp32 vs bf16, timings.

The weights are local ``save_pretrained`` folders (OWL-ViT with its processor and tokenizer, SAM 2,
DINOv2 with its processor). A cat photo on a 720x1280 canvas is the task's reference; the positive
control is that frame shifted (480x832 continuation), the negative control another context's frame
(a cup). It asserts that the positive is found and scores high, the negative scores lower, bf16
autocast stays close to fp32, and every stage's device preprocessing matches transformers' / PIL's
processors within 2 grey levels; with the quality models given (``--quality-dino``, ``--quality-clip-b32``,
``--quality-clip-l14`` + ``--aesthetic-head``), VBench's subject / background consistency and aesthetic
quality on the positive control match VBench's definition computed one frame at a time on the CPU
(within 1e-4 in fp32; bf16 within 0.02); it prints per-stage timings (cmbench/benchmarks/scorer_check.py).
``--tiny`` runs the same code on tiny random models on a CPU (the checks that need real weights are
then reported, not asserted); tests/test_gpu_check_scorer.py runs it so CI keeps it working.

    python scripts/gpu_check_scorer.py --owl /models/owlvit-base-patch32 --sam /models/sam2.1-hiera-large \
        --dino /models/dinov2-base --quality-dino /models/dino-vitb16 --quality-clip-b32 /models/clip-vit-base-patch32 \
        --quality-clip-l14 /models/clip-vit-large-patch14 --aesthetic-head /models/sa_0_4_vit_l_14_linear.pth \
        --json $OUT/gpu_check_scorer.json
    python scripts/gpu_check_scorer.py --tiny --device cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from cmbench.benchmarks.scorer_check import real_config, run_check, tiny_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--owl", help="OWL-ViT folder (model, processor, tokenizer)")
    parser.add_argument("--sam", help="SAM 2 folder")
    parser.add_argument("--dino", help="DINOv2 folder (model, image processor)")
    parser.add_argument("--quality-dino", help="DINO ViT-B/16 folder (facebook/dino-vitb16): subject consistency")
    parser.add_argument("--quality-clip-b32", help="CLIP ViT-B/32 folder: background consistency")
    parser.add_argument("--quality-clip-l14", help="CLIP ViT-L/14 folder: aesthetic quality (with --aesthetic-head)")
    parser.add_argument("--aesthetic-head", help="LAION's sa_0_4_vit_l_14_linear.pth")
    parser.add_argument("--tiny", action="store_true", help="tiny random models instead of real weights")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--frames", type=int, default=8, help="frames per control continuation")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the preprocessing timing")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    if not args.tiny and not (args.owl and args.sam and args.dino):
        parser.error("give --owl, --sam and --dino folders, or --tiny")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"scorer check on {args.device} ({device_name}), torch {torch.__version__}, "
          f"{'TINY RANDOM models' if args.tiny else 'real weights'}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            cfg = tiny_config(Path(tmp))
        else:
            quality = {name: settings for name, settings in (
                ("subject_consistency", {"model": args.quality_dino}),
                ("background_consistency", {"model": args.quality_clip_b32}),
                ("aesthetic_quality", {"model": args.quality_clip_l14, "head": args.aesthetic_head}),
            ) if all(settings.values())}
            cfg = real_config(args.owl, args.sam, args.dino, quality=quality)
        cfg["batch_size"] = args.batch
        report = run_check(cfg, args.device, tiny=args.tiny, n_frames=args.frames, rounds=args.rounds)

    print(f"\n{'check':<40} {'value':>10}  {'bound':<10} result")
    for c in report.checks:
        result = ("ok" if c.passed else "FAILED") if c.asserted else f"({'ok' if c.passed else 'off'}, not asserted)"
        print(f"{c.name:<40} {c.value:10.4f}  {c.bound:<10} {result}")
    print("\nscores:")
    for name, row in report.scores.items():
        if "score" in row:
            print(f"  {name:<16} score {row['score']:.4f}  detection rate {row['detection_rate']:.2f}")
        else:
            print(f"  {name:<16} " + "  ".join(f"{k} {v if isinstance(v, str) else f'{v:.5f}'}" for k, v in row.items()))
    print("\nms per frame (whole scorer and its stages):")
    for name, row in report.timings.items():
        if name.endswith("_ms_per_frame") and isinstance(row, dict):
            print(f"  {name:<32} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))
    print(f"\npreprocessing ms per frame at {args.frames} frames of 480x832 (old: previous host code; reference: "
          "transformers / PIL processors; new: device path):")
    for r in report.timings["preprocess_ms_per_frame"]:
        print(f"  {r['stage']:<14} old {r['old_ms']:8.3f}  reference {r['reference_ms']:8.3f}  new {r['new_ms']:8.3f}  "
              f"old/new {r['old_over_new']:6.1f}x")
    if "peak_gpu_memory_mb" in report.timings:
        print(f"peak GPU memory {report.timings['peak_gpu_memory_mb']:.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    failed = report.failures()
    if failed:
        print("\nFAILED: " + ", ".join(c.name for c in failed), file=sys.stderr)
    report.require_passed()
    print("\nall asserted checks passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
