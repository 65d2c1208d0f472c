"""Configuration dataclasses: one per model family, the data of a recipe, and training.

Every field has a comment; invalid values raise ValueError naming the field and the allowed values.
Choices are Literal strings so configs serialise to JSON.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, fields
from typing import Literal, Optional


def _check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise ValueError(f"{field} must be {allowed}, got {value!r}")


def _check_literals(obj) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        hint = hints[f.name]
        if typing.get_origin(hint) is Literal:
            allowed = typing.get_args(hint)
            value = getattr(obj, f.name)
            _check(value in allowed, f.name, "one of " + ", ".join(map(repr, allowed)), value)


class _Config:
    """JSON round-trip helpers shared by the config dataclasses."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(names)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass
class Seq2SeqConfig(_Config):
    """The encoder–decoder Transformer of Vaswani et al. 2017 (Table 3 "base": 512/8/6/2048)."""

    vocab_size: int = 8000            # joint source/target vocabulary (set from the tokenizer)
    d_model: int = 512                # model width D
    n_heads: int = 8                  # attention heads H; d_model % n_heads == 0
    n_encoder_layers: int = 6         # N encoder layers
    n_decoder_layers: int = 6         # N decoder layers
    d_ff: Optional[int] = None        # FFN hidden size; None = 4 * d_model
    dropout: float = 0.1              # P_drop on sublayer outputs and embedding sums (paper §5.4)
    attention_dropout: float = 0.0    # dropout on attention weights (not in the paper)
    norm_position: Literal["post", "pre"] = "post"  # Post-LN (paper) or Pre-LN (modern)
    activation: Literal["relu", "gelu"] = "relu"    # FFN non-linearity (paper: ReLU)
    max_seq_len: int = 256            # longest source or target sequence, in tokens
    tie_embeddings: bool = True       # share source, target embeddings and output projection (§3.4)
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math
    pad_id: int = 0                   # special token ids (from the tokenizer)
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        _check_literals(self)
        for name in ("vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff",
                     "max_seq_len"):
            _check(isinstance(getattr(self, name), int) and getattr(self, name) > 0, name,
                   "a positive integer", getattr(self, name))
        _check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}",
               self.d_model)
        _check(self.d_model % 2 == 0, "d_model", "even (sinusoidal positions)", self.d_model)
        for name in ("dropout", "attention_dropout"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("pad_id", "bos_id", "eos_id"):
            _check(0 <= getattr(self, name) < self.vocab_size, name, f"in [0, vocab_size={self.vocab_size})",
                   getattr(self, name))
        _check(len({self.pad_id, self.bos_id, self.eos_id}) == 3, "bos_id", "different from pad_id and eos_id",
               self.bos_id)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _swiglu_d_ff(d_model: int) -> int:
    """LLaMA's FFN size: 8/3 · D (the parameters of a 4·D two-matrix FFN), rounded up to a multiple of 32."""
    return -(-8 * d_model // 3 // 32) * 32


@dataclass
class GPTConfig(_Config):
    """A decoder-only Transformer with every switch of the GPT → LLaMA/Mistral/Mixtral line.

    Defaults are GPT-2 style; `from_name` applies a preset ("gpt2", "llama", "mistral", "mixtral").
    """

    vocab_size: int = 50304           # tokens (set from the tokenizer)
    d_model: int = 768                # model width D
    n_layers: int = 12                # decoder blocks
    n_heads: int = 12                 # query heads H; d_model % n_heads == 0
    n_kv_heads: Optional[int] = None  # key/value heads K (None = H: MHA; 1: MQA; else GQA); H % K == 0
    d_ff: Optional[int] = None        # FFN (or each expert's) hidden size; None = 4·D, or 8/3·D for SwiGLU
    max_seq_len: int = 1024           # context length; learned/sinusoidal tables have this many rows
    positions: Literal["learned", "sinusoidal", "rope"] = "learned"  # absolute (GPT) or rotary (LLaMA)
    rope_theta: float = 10000.0       # RoPE base θ
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # LayerNorm (GPT) or RMSNorm (LLaMA)
    norm_position: Literal["pre", "post"] = "pre"       # Pre-LN (GPT-2 on) or Post-LN (the 2017 paper)
    norm_eps: float = 1e-5            # ε of every norm
    activation: Literal["relu", "gelu", "gelu_tanh", "swiglu"] = "gelu"  # FFN non-linearity (gelu_tanh: GPT-2's)
    sliding_window: Optional[int] = None  # attend to the W most recent positions only (Mistral); None = all
    n_experts: int = 0                # mixture of experts per block: 0 = dense FFN, else E experts
    moe_top_k: int = 2                # experts per token (1 <= moe_top_k <= n_experts)
    router_aux_loss_coef: float = 0.01  # weight of the load-balancing loss added to the training loss
    tie_embeddings: bool = True       # output projection shares the token embedding matrix
    init_std: float = 0.02            # std of the normal init of every matrix (GPT-2's; HF initializer_range)
    bias: bool = True                 # biases on linear layers and LayerNorm
    qkv_bias: Optional[bool] = None   # biases on the q/k/v projections alone (Qwen2); None = bias
    dropout: float = 0.0              # on embeddings and sublayer outputs
    attention_dropout: float = 0.0    # on attention weights
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel (FlashAttention path) or explicit math
    bos_id: Optional[int] = None      # special token ids, from the tokenizer (None = it has none)
    eos_id: Optional[int] = None      # generation stops at this token by default

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_ff is None:
            self.d_ff = _swiglu_d_ff(self.d_model) if self.activation == "swiglu" else 4 * self.d_model
        _check_literals(self)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name, "a positive integer", value)
        _check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        _check(self.n_heads % self.n_kv_heads == 0, "n_kv_heads", f"a divisor of n_heads={self.n_heads}",
               self.n_kv_heads)
        if self.positions == "rope":
            _check(self.head_dim % 2 == 0, "d_model / n_heads", "even for RoPE (head dim)", self.head_dim)
            _check(self.rope_theta > 0, "rope_theta", "> 0", self.rope_theta)
        if self.positions == "sinusoidal":
            _check(self.d_model % 2 == 0, "d_model", "even for sinusoidal positions", self.d_model)
        _check(self.sliding_window is None or self.sliding_window >= 1, "sliding_window", ">= 1 or None",
               self.sliding_window)
        _check(self.n_experts >= 0, "n_experts", ">= 0 (0 = dense FFN)", self.n_experts)
        if self.n_experts:
            _check(1 <= self.moe_top_k <= self.n_experts, "moe_top_k", f"in 1..n_experts={self.n_experts}",
                   self.moe_top_k)
        _check(self.router_aux_loss_coef >= 0, "router_aux_loss_coef", ">= 0", self.router_aux_loss_coef)
        _check(self.norm_eps > 0, "norm_eps", "> 0", self.norm_eps)
        _check(self.init_std > 0, "init_std", "> 0", self.init_std)
        for name in ("dropout", "attention_dropout"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            _check(value is None or 0 <= value < self.vocab_size, name, f"None or in [0, vocab_size={self.vocab_size})",
                   value)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_name(cls, name: str, **overrides) -> "GPTConfig":
        """A preset style with `overrides` on top (sizes, or any field).

        "gpt2": learned positions, LayerNorm, GELU, biases (Radford et al. 2019).
        "llama": RoPE, RMSNorm, SwiGLU, no biases, grouped-query attention with two query heads per
            KV head unless n_kv_heads is given (Touvron et al. 2023; Ainslie et al. 2023).
        "mistral": llama + a sliding window of max_seq_len / 2 unless given (Jiang et al. 2023).
        "mixtral": mistral + 8 experts, 2 per token (Jiang et al. 2024).
        Raises:
            ValueError: for an unknown name (listing the presets) or an invalid field.
        """
        if name not in GPT_PRESETS:
            raise ValueError(f"unknown GPT preset {name!r}; known presets: {', '.join(GPT_PRESETS)}")
        fields_ = {**GPT_PRESETS[name], **overrides}
        if name != "gpt2" and "n_kv_heads" not in overrides:
            heads = fields_.get("n_heads", cls.n_heads)
            fields_["n_kv_heads"] = heads // 2 if heads % 2 == 0 else heads
        if name in ("mistral", "mixtral") and "sliding_window" not in overrides:
            fields_["sliding_window"] = max(1, fields_.get("max_seq_len", cls.max_seq_len) // 2)
        return cls(**fields_)


_LLAMA = dict(positions="rope", norm="rmsnorm", activation="swiglu", bias=False, norm_eps=1e-6)
GPT_PRESETS: dict[str, dict] = {
    "gpt2": dict(positions="learned", norm="layernorm", activation="gelu", bias=True),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": {**_LLAMA, "n_experts": 8, "moe_top_k": 2},
}


@dataclass
class BertConfig(_Config):
    """The BERT encoder (Devlin et al. 2019): Post-LN, GELU, learned positions and segment embeddings.

    Defaults are BERT-base (Table/§3: L=12, H=768, A=12, 110 M parameters).
    """

    vocab_size: int = 30522           # WordPiece vocabulary (set from the tokenizer)
    d_model: int = 768                # hidden size H
    n_layers: int = 12                # encoder layers L
    n_heads: int = 12                 # attention heads A; d_model % n_heads == 0
    d_ff: Optional[int] = None        # FFN hidden size; None = 4 * d_model
    max_seq_len: int = 512            # rows of the learned position table
    type_vocab_size: int = 2          # segments (sentence A / B)
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"  # FFN non-linearity
    norm_eps: float = 1e-12           # LayerNorm ε (BERT's)
    dropout: float = 0.1              # on embeddings and sublayer outputs
    attention_dropout: float = 0.1    # on attention weights
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math
    n_labels: int = 2                 # classes of the sequence-classification head
    pad_id: int = 0                   # special token ids (from the tokenizer; None = unknown)
    cls_id: Optional[int] = None
    sep_id: Optional[int] = None
    mask_id: Optional[int] = None

    def __post_init__(self):
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        _check_literals(self)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len", "type_vocab_size",
                     "n_labels"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name, "a positive integer", value)
        _check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        _check(self.norm_eps > 0, "norm_eps", "> 0", self.norm_eps)
        _check(self.n_labels >= 2, "n_labels", ">= 2 (a classifier needs two classes or more)", self.n_labels)
        for name in ("dropout", "attention_dropout"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("pad_id", "cls_id", "sep_id", "mask_id"):
            value = getattr(self, name)
            _check(value is None and name != "pad_id" or value is not None and 0 <= value < self.vocab_size, name,
                   f"in [0, vocab_size={self.vocab_size})", value)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class ViTConfig(_Config):
    """The Vision Transformer (Dosovitskiy et al. 2021): P×P patches, [CLS], learned positions, Pre-LN."""

    image_size: int = 224             # training image side (square); other sizes interpolate positions
    patch_size: int = 16              # P; image_size % patch_size == 0
    in_channels: int = 3              # C (1 for MNIST)
    n_classes: int = 1000             # classes of the head
    d_model: int = 768                # hidden size D
    n_layers: int = 12                # encoder layers
    n_heads: int = 12                 # attention heads; d_model % n_heads == 0
    d_ff: Optional[int] = None        # MLP hidden size; None = 4 * d_model
    dropout: float = 0.0              # on embeddings and sublayer outputs
    attention_dropout: float = 0.0    # on attention weights
    norm_eps: float = 1e-6            # LayerNorm ε (ViT's)
    attention_impl: Literal["sdpa", "math"] = "sdpa"  # fused kernel or explicit math

    def __post_init__(self):
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        _check_literals(self)
        for name in ("image_size", "patch_size", "in_channels", "n_classes", "d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name, "a positive integer", value)
        _check(self.image_size % self.patch_size == 0, "image_size", f"divisible by patch_size={self.patch_size}",
               self.image_size)
        _check(self.d_model % self.n_heads == 0, "d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        for name in ("dropout", "attention_dropout"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))

    @property
    def grid(self) -> int:
        """Patches per side at the training size."""
        return self.image_size // self.patch_size


@dataclass
class ImageDataConfig(_Config):
    """Which images an image-classification recipe trains on, its split and augmentation."""

    dataset: Literal["mnist", "digits"] = "mnist"  # data set name (data/datasets.py)
    n_train: int = 8000               # images for training (seeded split of the data set)
    n_test: int = 2000                # held-out images for evaluation
    batch_size: int = 128             # images per batch
    max_shift: int = 0                # random translation augmentation, in pixels (0 = none)

    def __post_init__(self):
        _check_literals(self)
        for name in ("n_train", "n_test", "batch_size"):
            _check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        _check(self.max_shift >= 0, "max_shift", ">= 0", self.max_shift)


@dataclass
class TextClassificationDataConfig(_Config):
    """Which sentences a text-classification (or masked-LM) recipe trains on and how it tokenizes."""

    objective: Literal["classification", "mlm"] = "classification"  # fine-tune a classifier, or pretrain (MLM)
    dataset: Literal["sst2"] = "sst2"  # labelled sentences (data/datasets.py); dev is the evaluation split
    tokenizer_vocab_size: int = 8000  # WordPiece vocabulary trained from the text (models from scratch)
    max_len: int = 64                 # longer sentences are truncated (with a warning at inference)
    batch_size: int = 32              # sentences per batch
    mlm_probability: float = 0.15     # masked-LM pretraining: share of eligible tokens chosen (BERT §3.1)
    n_train: Optional[int] = None     # use only the first N training sentences (None = all)

    def __post_init__(self):
        _check_literals(self)
        _check(self.tokenizer_vocab_size >= 100, "tokenizer_vocab_size", ">= 100", self.tokenizer_vocab_size)
        for name in ("max_len", "batch_size"):
            _check(getattr(self, name) >= 2, name, ">= 2", getattr(self, name))
        _check(0.0 < self.mlm_probability < 1.0, "mlm_probability", "in (0, 1)", self.mlm_probability)
        _check(self.n_train is None or self.n_train >= 1, "n_train", "None or >= 1", self.n_train)


@dataclass
class TextDataConfig(_Config):
    """The text a language-model recipe trains on, its tokenizer and its batches."""

    dataset: Literal["tinyshakespeare"] = "tinyshakespeare"  # data set name (data/datasets.py)
    tokenizer: Literal["char", "bpe"] = "char"  # one token per character (byte), or our byte-level BPE
    tokenizer_vocab_size: int = 1024  # BPE vocabulary size (tokenizer "bpe" only)
    train_fraction: float = 0.9       # the first 90% of the text trains, the rest validates (nanoGPT)
    block_size: int = 64              # tokens per training sequence (<= the model's max_seq_len)
    batch_size: int = 12              # sequences per micro-batch, at random offsets
    eval_tokens: Optional[int] = None  # validation tokens scored per evaluation (None = the whole split)

    def __post_init__(self):
        _check_literals(self)
        _check(0.0 < self.train_fraction < 1.0, "train_fraction", "in (0, 1)", self.train_fraction)
        _check(self.tokenizer_vocab_size >= 256, "tokenizer_vocab_size", ">= 256", self.tokenizer_vocab_size)
        for name in ("block_size", "batch_size"):
            _check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        _check(self.eval_tokens is None or self.eval_tokens >= 1, "eval_tokens", "None or >= 1", self.eval_tokens)


@dataclass
class TranslationDataConfig(_Config):
    """Which parallel data a translation recipe trains on and how it is tokenized."""

    dataset: Literal["multi30k"] = "multi30k"  # data set name (data/datasets.py)
    src_lang: Literal["en", "de", "fr"] = "en"  # source language
    tgt_lang: Literal["en", "de", "fr"] = "de"  # target language
    tokenizer_vocab_size: int = 8000  # joint byte-level BPE vocabulary size, special tokens included
    max_len: int = 128                # longer training pairs are truncated to this many tokens
    test_split: Literal["test_2016_flickr"] = "test_2016_flickr"  # the split `evaluate --split test` reads

    def __post_init__(self):
        _check_literals(self)
        _check(self.src_lang != self.tgt_lang, "tgt_lang", f"different from src_lang={self.src_lang!r}",
               self.tgt_lang)
        _check(self.tokenizer_vocab_size >= 259, "tokenizer_vocab_size", ">= 259 (256 bytes + 3 specials)",
               self.tokenizer_vocab_size)
        _check(self.max_len >= 2, "max_len", ">= 2", self.max_len)


@dataclass
class TrainConfig(_Config):
    """Optimisation, schedule, budget and evaluation of one training run."""

    batch_tokens: int = 4000          # target tokens per batch (length-bucketed batches)
    lr_schedule: Literal["noam", "cosine", "constant"] = "noam"  # noam: the paper's warm-up + inverse
                                      # sqrt decay; cosine: warm-up, then cosine decay from lr to min_lr
    lr_factor: float = 1.0            # noam: lr = factor · d_model^-0.5 · min(step^-0.5, step·warmup^-1.5)
    lr: float = 5e-4                  # peak learning rate of the cosine and constant schedules
    min_lr: float = 0.0               # cosine: the learning rate at lr_decay_steps and after
    lr_decay_steps: Optional[int] = None  # cosine: the step where the decay ends (None = max_steps)
    warmup_steps: int = 4000          # linear warm-up steps (paper: 4000)
    grad_accum_steps: int = 1         # micro-batches whose gradients add up to one optimizer step
    beta1: float = 0.9                # Adam β1 (paper §5.3)
    beta2: float = 0.98               # Adam β2
    eps: float = 1e-9                 # Adam ε
    weight_decay: float = 0.0         # decoupled weight decay (AdamW), 0 = the paper's Adam
    label_smoothing: float = 0.1      # ε_ls (paper §5.4)
    clip_grad_norm: float = 1.0       # max global gradient norm; 0 = no clipping
    max_steps: Optional[int] = None   # step budget (None = unlimited)
    minutes: Optional[float] = None   # wall-clock budget for training, evaluations included
    eval_every: int = 1000            # steps between validations (loss + BLEU)
    eval_bleu_sentences: int = 500    # validation sentences decoded for BLEU at each evaluation
    log_every: int = 50               # steps between metrics.jsonl lines
    checkpoint_every: int = 500       # steps between resumable checkpoints
    average_last: int = 0             # average the weights of the last N checkpoints at the end (0 = off)
    beam_size: int = 4                # beam width for final evaluation / translation (paper §6.1)
    length_penalty: float = 0.6       # α of the GNMT length penalty (paper §6.1)
    autocast: Literal["none", "bf16"] = "none"  # bf16 autocast for matmuls (CPU with AVX512-BF16)
    init: Optional[str] = None        # start from these weights: a run directory or a pretrained model name
                                      # (e.g. all-minilm-l6-v2); None or "none" = random initialisation
    seed: int = 0                     # seeds the data order, initialisation and dropout
    threads: int = 0                  # torch threads; 0 = all cores

    def __post_init__(self):
        _check_literals(self)
        for name in ("batch_tokens", "warmup_steps", "eval_every", "log_every", "checkpoint_every",
                     "beam_size", "eval_bleu_sentences"):
            _check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        _check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        for name in ("beta1", "beta2"):
            _check(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        for name in ("eps", "lr", "lr_factor"):
            _check(getattr(self, name) > 0, name, "> 0", getattr(self, name))
        _check(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        _check(0 <= self.min_lr <= self.lr, "min_lr", f"in [0, lr={self.lr}]", self.min_lr)
        _check(self.grad_accum_steps >= 1, "grad_accum_steps", ">= 1", self.grad_accum_steps)
        _check(self.lr_decay_steps is None or self.lr_decay_steps > self.warmup_steps, "lr_decay_steps",
               f"None or > warmup_steps={self.warmup_steps}", self.lr_decay_steps)
        _check(self.length_penalty >= 0, "length_penalty", ">= 0", self.length_penalty)
        _check(self.beam_size <= 64, "beam_size", "in 1..64", self.beam_size)
        _check(self.max_steps is None or self.max_steps > 0, "max_steps", "> 0 or None", self.max_steps)
        _check(self.minutes is None or self.minutes > 0, "minutes", "> 0 or None", self.minutes)
        _check(self.average_last >= 0, "average_last", ">= 0", self.average_last)
        _check(self.clip_grad_norm >= 0, "clip_grad_norm", ">= 0", self.clip_grad_norm)
        _check(self.threads >= 0, "threads", ">= 0", self.threads)


def parse_value(cls, name: str, text: str):
    """Convert the text of a `--set name=text` to the type of field `name` of dataclass `cls`.

    Raises:
        ValueError: naming the field and the expected type when the text does not parse.
    """
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Literal:
        return text
    if text.lower() in ("none", "null") and type(None) in typing.get_args(hint):
        return None
    base = args[0] if typing.get_origin(hint) is typing.Union else hint
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        return base(text)
    except ValueError:
        raise ValueError(f"{name} must be {getattr(base, '__name__', base)}, got {text!r}") from None
