"""hyla: Attention as a Hypernetwork (Schug et al., ICLR 2025) in PyTorch."""

from hyla.attention import PRESETS, Attention, AttentionConfig, attention_preset

__version__ = "0.1.0"
__all__ = ["PRESETS", "Attention", "AttentionConfig", "__version__", "attention_preset"]
