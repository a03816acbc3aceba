"""Test-wide settings: never touch a model hub; one torch thread (see docs/speed.md)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)  # tiny tensors: one thread is faster than two on a shared 2-core machine
