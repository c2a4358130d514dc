"""Attention as a hypernetwork: the variants, their direct and naive implementations and kernels."""

from hyla.attention.cache import KVCache
from hyla.attention.config import (
    NONLINEARITIES,
    NORMALIZATIONS,
    PRESET_TITLES,
    PRESETS,
    VALUE_NETWORKS,
    AttentionConfig,
    attention_preset,
)
from hyla.attention.hypernetwork import GeneratedValueNetwork
from hyla.attention.module import Attention, HookPoint
from hyla.attention.position import RelativePositionBias

__all__ = [
    "NONLINEARITIES",
    "NORMALIZATIONS",
    "PRESETS",
    "PRESET_TITLES",
    "VALUE_NETWORKS",
    "Attention",
    "AttentionConfig",
    "GeneratedValueNetwork",
    "HookPoint",
    "KVCache",
    "RelativePositionBias",
    "attention_preset",
]
