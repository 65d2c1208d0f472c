"""Building blocks of the Transformer family; arguments are plain ints/strings, never configs."""
from attnlab.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from attnlab.nn.blocks import DecoderLayer, EncoderLayer
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.mlp import FeedForward
from attnlab.nn.positional import SinusoidalPositionalEncoding

__all__ = [
    "MultiHeadAttention", "scaled_dot_product_attention", "EncoderLayer", "DecoderLayer", "KVCache",
    "causal_mask", "padding_mask", "FeedForward", "SinusoidalPositionalEncoding",
]
