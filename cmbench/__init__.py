"""CMBench: a benchmark and harness for KV-cache compression in autoregressive video diffusion."""

__version__ = "0.1.0"
