"""Test-wide settings: never touch a model hub, keep torch to the CI machine's two cores."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
