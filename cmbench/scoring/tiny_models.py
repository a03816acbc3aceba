"""Tiny random-weight OWL-ViT / OWLv2, SAM 2 and DINOv2 checkpoints for plumbing tests and benchmarks.

No model hub is reachable from CMBench's build machines, so tests and ``scripts/bench_scorer.py``
build these from configs, ``save_pretrained`` them into a folder and load them back through the
same ``from_pretrained`` path real weights use. Their outputs are meaningless (random weights); they
exercise shapes, batching, preprocessing and post-processing. Sizes follow environment.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TOKENIZER_VOCAB = 514  # 256 bytes + 256 word-final bytes + BOS + EOS (at the END: ids 512, 513)
OWL_IMAGE_SIZE = 64
SAM_IMAGE_SIZE = 128
DINO_IMAGE_SIZE = 56
DINO_SHORTEST_EDGE = 64  # 256 / 224 of the crop, as facebook/dinov2-*'s processors
# the released models' preprocessing: OWL-ViT B/32 768, OWLv2 960, SAM 2 1024, DINOv2 256 -> 224
# Input sizes of the released models' processors: OWL's square side per detector, SAM 2's image side,
# DINOv2's (shorter side, crop).
RELEASED_OWL_SIZES = {"owlvit": 768, "owlv2": 960}
RELEASED_SAM2_SIZE = 1024
RELEASED_DINOV2_SIZES = (256, 224)


def byte_tokenizer():
    """A CLIP tokenizer over single bytes (no merges) with BOS/EOS last in the vocab.

    OWL-ViT treats a query whose first id is 0 as padding, so BOS must not be id 0.
    """
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": 256 + i for i, s in enumerate(symbols)})
    vocab["<|startoftext|>"] = 512
    vocab["<|endoftext|>"] = 513
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16)


def save_tiny_owl(folder: str | Path, version: str = "owlvit", seed: int = 0, processor_size: int = OWL_IMAGE_SIZE) -> Path:
    """Write a tiny OWL-ViT (``version="owlvit"``) or OWLv2 (``"owlv2"``) model + processor.

    ``processor_size`` is the processor's square output (another size than the model's 64 only
    for timing preprocessing at a released model's cost; the model does not run on it).

    Returns
    -------
    Path of the folder (loadable with ``from_pretrained``).
    """
    import transformers

    prefix = {"owlvit": "OwlViT", "owlv2": "Owlv2"}[version]
    config = getattr(transformers, f"{prefix}Config")(
        text_config=dict(
            vocab_size=TOKENIZER_VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=16, bos_token_id=512, eos_token_id=513, pad_token_id=513,
        ),
        vision_config=dict(
            image_size=OWL_IMAGE_SIZE, patch_size=16, hidden_size=32, intermediate_size=37,
            num_hidden_layers=2, num_attention_heads=4,
        ),
        projection_dim=32,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForObjectDetection")(config)
    size = {"height": processor_size, "width": processor_size}
    image_processor: transformers.OwlViTImageProcessorPil | transformers.Owlv2ImageProcessorPil
    if version == "owlvit":
        image_processor = transformers.OwlViTImageProcessorPil(size=size, crop_size=size)
    else:
        image_processor = transformers.Owlv2ImageProcessorPil(size=size)
    processor = getattr(transformers, f"{prefix}Processor")(image_processor=image_processor, tokenizer=byte_tokenizer())
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def save_tiny_sam2(folder: str | Path, seed: int = 0, image_size: int = SAM_IMAGE_SIZE) -> Path:
    """Write a tiny SAM 2 (128 px input; ``image_size=1024`` keeps the tiny widths at the released
    input size). Returns the folder."""
    from transformers import (
        Sam2Config,
        Sam2HieraDetConfig,
        Sam2MaskDecoderConfig,
        Sam2Model,
        Sam2PromptEncoderConfig,
        Sam2VisionConfig,
    )

    backbone = Sam2HieraDetConfig(
        hidden_size=12, image_size=image_size, blocks_per_stage=[1, 1, 2, 1], embed_dim_per_stage=[12, 24, 48, 96],
        num_attention_heads_per_stage=[1, 1, 1, 1], global_attention_blocks=[3], window_size_per_stage=[8, 4, 4, 2],
    )
    vision = Sam2VisionConfig(
        backbone_config=backbone, backbone_channel_list=[96, 48, 24, 12],
        backbone_feature_sizes=[[image_size // 4 >> level] * 2 for level in range(3)], fpn_hidden_size=32,
    )
    config = Sam2Config(
        vision_config=vision,
        prompt_encoder_config=Sam2PromptEncoderConfig(
            hidden_size=32, image_size=image_size, patch_size=16, mask_input_channels=8
        ),
        mask_decoder_config=Sam2MaskDecoderConfig(hidden_size=32, mlp_dim=64, num_attention_heads=4, iou_head_hidden_dim=32),
    )
    torch.manual_seed(seed)
    folder = Path(folder)
    Sam2Model(config).save_pretrained(folder)
    return folder


def save_tiny_dinov2(
    folder: str | Path, seed: int = 0, processor_sizes: tuple[int, int] = (DINO_SHORTEST_EDGE, DINO_IMAGE_SIZE)
) -> Path:
    """Write a tiny DINOv2 (patch 14, hidden 32) and its image processor, the released models'
    ``BitImageProcessor`` settings scaled to the tiny input (bicubic resize of the shorter side to 64,
    centre crop 56, ImageNet mean / std; ``processor_sizes`` = (shorter side, crop)). Returns the folder."""
    from transformers import BitImageProcessorPil, Dinov2Config, Dinov2Model

    from cmbench.scoring.imagenet import IMAGENET_MEAN, IMAGENET_STD

    config = Dinov2Config(
        image_size=DINO_IMAGE_SIZE, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    )  # DINOv2's MLP width is hidden_size * mlp_ratio (it has no intermediate_size)
    torch.manual_seed(seed)
    folder = Path(folder)
    Dinov2Model(config).save_pretrained(folder)
    BitImageProcessorPil(
        size={"shortest_edge": processor_sizes[0]}, crop_size={"height": processor_sizes[1], "width": processor_sizes[1]},
        resample=3, image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD),
    ).save_pretrained(folder)
    return folder


def tiny_deep_scorer_config(
    folder: str | Path, detector: str = "owlvit", seed: int = 0, released_preprocessing: bool = False
) -> dict[str, Any]:
    """Save the three tiny models under ``folder`` and return a scorer config using them.

    The config mirrors ``configs/scorer/owl_sam_dino.yaml`` with local model folders, CPU, no cache
    (set ``cache_dir`` to enable it) and a detection threshold of 0 (random detectors score low).
    ``seed`` seeds the random weights (another seed: other weights in the same folders).
    ``released_preprocessing``: the processors and SAM 2's input take the released models' sizes
    (:data:`RELEASED_OWL_SIZES`, :data:`RELEASED_SAM2_SIZE`, :data:`RELEASED_DINOV2_SIZES`), so preprocessing costs what it costs for real models; for timing only.
    """
    folder = Path(folder)
    owl_size = RELEASED_OWL_SIZES.get(detector, OWL_IMAGE_SIZE) if released_preprocessing else OWL_IMAGE_SIZE
    sam_size = RELEASED_SAM2_SIZE if released_preprocessing else SAM_IMAGE_SIZE
    dino_sizes = RELEASED_DINOV2_SIZES if released_preprocessing else (DINO_SHORTEST_EDGE, DINO_IMAGE_SIZE)
    return {
        "name": f"tiny_{detector}_sam_dino",
        "device": "cpu",
        "precision": "fp32",
        "batch_size": 4,
        "cache_dir": None,
        "min_box_size": 1.0,
        "reference_aggregation": "mean",
        "detector": {
            "backend": detector,
            "model": str(save_tiny_owl(folder / detector, version=detector, seed=seed, processor_size=owl_size)),
            "query_template": "a {}",
            "score_threshold": 0.0,
        },
        "segmenter": {"backend": "sam2", "model": str(save_tiny_sam2(folder / "sam2", seed=seed, image_size=sam_size)),
                      "mask_threshold": 0.0},
        "embedder": {
            "backend": "dinov2",
            "model": str(save_tiny_dinov2(folder / "dinov2", seed=seed, processor_sizes=dino_sizes)),
            "crop_mode": "processor",
            "background": 0,
        },
    }


def save_tiny_dino_vit(folder: str | Path, seed: int = 0) -> Path:
    """Write a tiny DINO ViT (``ViTModel``, patch 16, hidden 32) standing in for ``facebook/dino-vitb16``
    (VBench's subject consistency). Returns the folder."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=224, patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=37)
    torch.manual_seed(seed)
    folder = Path(folder)
    ViTModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def save_tiny_clip_vision(folder: str | Path, seed: int = 0, image_size: int = 32, projection_dim: int = 24) -> Path:
    """Write a tiny CLIP vision tower with its projection (``CLIPVisionModelWithProjection``, patch 16),
    standing in for ``openai/clip-vit-base-patch32`` / ``-large-patch14``. Returns the folder."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(image_size=image_size, patch_size=16, hidden_size=32, intermediate_size=37,
                              num_hidden_layers=2, num_attention_heads=4, projection_dim=projection_dim)
    torch.manual_seed(seed)
    folder = Path(folder)
    CLIPVisionModelWithProjection(config).save_pretrained(folder)
    return folder


def save_tiny_aesthetic_head(path: str | Path, width: int = 24, seed: int = 0) -> Path:
    """Write a random linear head ``width -> 1`` in LAION's ``sa_0_4_vit_l_14_linear.pth`` layout (a
    ``torch.nn.Linear`` state dict). Returns the path."""
    torch.manual_seed(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torch.nn.Linear(width, 1).state_dict(), path)
    return path


def tiny_quality_settings(folder: str | Path, seed: int = 0) -> dict[str, dict[str, Any]]:
    """``scorer.quality_settings`` for VBench's network metrics on tiny random models saved under ``folder``
    (subject consistency, background consistency, aesthetic quality; imaging quality and motion smoothness
    keep their defaults: absent here)."""
    folder = Path(folder)
    return {
        "subject_consistency": {"model": str(save_tiny_dino_vit(folder / "dino_vitb16", seed=seed))},
        "background_consistency": {"model": str(save_tiny_clip_vision(folder / "clip_b32", seed=seed))},
        "aesthetic_quality": {"model": str(save_tiny_clip_vision(folder / "clip_l14", seed=seed + 1)),
                              "head": str(save_tiny_aesthetic_head(folder / "aesthetic_head.pth", seed=seed))},
    }
