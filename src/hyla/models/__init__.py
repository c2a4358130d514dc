"""Models built from the attention family."""

from hyla.models.transformer import MLP, MoE, Transformer, TransformerConfig, num_parameters

__all__ = ["MLP", "MoE", "Transformer", "TransformerConfig", "num_parameters"]
