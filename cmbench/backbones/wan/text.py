"""The umt5 text encoder of the Wan family through transformers' ``UMT5EncoderModel``.

As Wan's runtime: a prompt is cleaned (HTML entities, whitespace runs; ``ftfy`` when installed),
tokenised to at most ``text_len`` tokens with the end-of-sequence token, encoded with its attention
mask, and the states of the padding positions are set to zero. The DiT's cross-attention then reads
all ``text_len`` positions (zeros included) without a mask, exactly as ``WanModel`` pads its context.
"""

from __future__ import annotations

import html
import re
from collections import OrderedDict
from pathlib import Path

import torch

from cmbench.backbones.wan.precision import parse_dtype
from cmbench.errors import ConfigError

CACHE_SIZE = 64  # prompts kept encoded (a context's 6 clip prompts plus its tasks' continue prompts)


def clean_prompt(text: str) -> str:
    """Wan's ``whitespace`` cleaning: fix text (ftfy, if installed), unescape HTML twice, collapse spaces."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text))
    return re.sub(r"\s+", " ", text).strip()


class TextEncoder:
    """Prompts -> zero-padded umt5 states ``[B, text_len, d_model]``.

    Parameters
    ----------
    model : transformers UMT5EncoderModel or T5EncoderModel
    tokenizer : transformers tokenizer
    text_len : int
        Context length of the DiT's cross-attention (512 for Wan).
    device : str
    """

    def __init__(self, model, tokenizer, text_len: int = 512, device: str = "cpu") -> None:
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.text_len = int(text_len)
        self.device = torch.device(device)
        self.dim = int(model.config.d_model)
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    @classmethod
    def from_pretrained(cls, path: str | Path, tokenizer: str | Path | None = None, text_len: int = 512,
                        device: str = "cpu", dtype: str | torch.dtype = "bfloat16") -> "TextEncoder":
        """Load a transformers encoder folder and its tokenizer.

        Parameters
        ----------
        path : str or Path
            ``text_encoder/`` folder (``config.json`` with model_type ``umt5`` or ``t5``), e.g. that of
            ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` (umt5-xxl, the weights of Wan's
            ``models_t5_umt5-xxl-enc-bf16.pth``).
        tokenizer : str or Path, optional
            Tokenizer folder; default: ``../tokenizer`` next to ``path`` if present, else ``path``.
        """
        from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, T5EncoderModel, UMT5EncoderModel

        path = Path(path).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"text encoder not found: {path} has no config.json (expected a transformers umt5 "
                              f"encoder folder, e.g. text_encoder/ of Wan-AI/Wan2.1-T2V-1.3B-Diffusers)")
        if tokenizer is None:
            sibling = path.parent / "tokenizer"
            tokenizer = sibling if sibling.is_dir() else path
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        classes: dict[str, type[PreTrainedModel]] = {"umt5": UMT5EncoderModel, "t5": T5EncoderModel}
        if config.model_type not in classes:
            raise ConfigError(f"{path}: model_type {config.model_type!r} is not a T5 family encoder "
                              f"({sorted(classes)})")
        model = classes[config.model_type].from_pretrained(str(path), local_files_only=True, dtype=parse_dtype(dtype))
        tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        return cls(model, tok, text_len, device)

    @torch.no_grad()
    def encode_batch(self, prompts: list[str]) -> torch.Tensor:
        """Encode prompts without the cache.

        Returns
        -------
        Tensor, shape ``[len(prompts), text_len, d_model]`` (model dtype, on the encoder's device);
        positions after each prompt's last token are zero.
        """
        batch = self.tokenizer([clean_prompt(p) for p in prompts], padding="max_length", truncation=True,
                               max_length=self.text_len, add_special_tokens=True, return_tensors="pt")
        ids = batch["input_ids"].to(self.device)
        mask = batch["attention_mask"].to(self.device)
        states = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return states * mask[..., None].to(states.dtype)

    def clear_cache(self) -> None:
        """Forget the encoded prompts (their next use encodes them again)."""
        self._cache.clear()

    def encode(self, prompt: str) -> torch.Tensor:
        """One prompt, cached: ``[1, text_len, d_model]``."""
        if prompt in self._cache:
            self._cache.move_to_end(prompt)
            return self._cache[prompt]
        out = self.encode_batch([prompt])
        self._cache[prompt] = out
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return out
