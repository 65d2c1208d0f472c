"""Building blocks of the Transformer family; arguments are plain ints/strings, never configs."""
from attnlab.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.blocks import LayerOutput, TransformerLayer, encoder_layer
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.mlp import FeedForward, SwiGLU
from attnlab.nn.moe import MixtureOfExperts
from attnlab.nn.norm import RMSNorm
from attnlab.nn.positional import SinusoidalPositionalEncoding
from attnlab.nn.rope import RotaryEmbedding, apply_rope

__all__ = [
    "MultiHeadAttention", "scaled_dot_product_attention", "TransformerLayer", "LayerOutput", "encoder_layer",
    "KVCache", "causal_mask", "padding_mask", "FeedForward", "SwiGLU", "MixtureOfExperts", "RMSNorm",
    "SinusoidalPositionalEncoding", "RotaryEmbedding", "apply_rope",
]
