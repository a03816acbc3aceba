"""Real Wan-family backbones on the causal DiT: LingBot World v2 and the Wan2.1-T2V-1.3B family.

- :func:`~cmbench.backbones.wan.lingbot.load_lingbot_world`: LingBot World v2 (I2V + camera);
- :func:`~cmbench.backbones.wan.wan_t2v.load_wan_t2v`: Self-Forcing, Causal Forcing, LongLive;
- :class:`~cmbench.backbones.wan.backbone.WanBackbone`: the backbone both return;
- :mod:`~cmbench.backbones.wan.checkpoint`: checkpoint files, key layouts, LoRA, strict checks.

See docs/real_backbones.md for downloads and run commands (GPU only).
"""

from cmbench.backbones.wan.backbone import WanBackbone, WanCondition
from cmbench.backbones.wan.lingbot import load_lingbot_world
from cmbench.backbones.wan.wan_t2v import load_wan_t2v

__all__ = ["WanBackbone", "WanCondition", "load_lingbot_world", "load_wan_t2v"]
