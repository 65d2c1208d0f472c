"""The language-modelling task for the shared training loop: next-token prediction on random blocks.

Shape legend: B sequences, T block size, V vocabulary.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnlab.tasks.language_model import TextDataConfig

from attnlab.train.config import TrainConfig
from attnlab.data.text import TokenStream


class LanguageModelTask:
    """Teacher-forced next-token cross-entropy (+ the MoE load-balancing loss) on blocks of
    data_cfg.block_size tokens at random offsets; validation scores the whole validation text once,
    in consecutive blocks.

    An epoch is as many batches as cover the training text once (in expectation); its offsets are
    drawn from a generator seeded by (seed, epoch), so a resumed run sees the same batches.

    Args:
        train, val: the tokenized splits. data_cfg: block and batch sizes. train_cfg: seed and label
            smoothing. aux_loss_coef: weight of the model's aux_loss. token_bytes: (V,) bytes per token
            (for bits per byte); None to skip that metric.
    """

    best_metric = "val_loss"
    higher_is_better = False

    def __init__(self, train: TokenStream, val: TokenStream, data_cfg: TextDataConfig, train_cfg: TrainConfig,
                 aux_loss_coef: float = 0.0, token_bytes: torch.Tensor | None = None):
        train.check_block(data_cfg.block_size, "training")
        val.check_block(1, "validation")
        self.train, self.val, self.data_cfg, self.train_cfg = train, val, data_cfg, train_cfg
        self.aux_loss_coef, self.token_bytes = aux_loss_coef, token_bytes
        self.batches_per_epoch = max(1, len(train) // (data_cfg.batch_size * data_cfg.block_size))

    def batches(self, epoch: int) -> list[torch.Tensor]:
        """The (B,) start offsets of every batch of `epoch`."""
        g = torch.Generator().manual_seed(self.train_cfg.seed * 1_000_003 + epoch)
        offsets = self.train.random_offsets(self.batches_per_epoch, self.data_cfg.batch_size,
                                            self.data_cfg.block_size, g)
        return list(offsets)

    def loss(self, model, offsets: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Mean cross-entropy of the next token over a (B, T) batch, plus aux_loss_coef · aux_loss."""
        x, y = self.train.blocks(offsets, self.data_cfg.block_size)  # (B, T) each
        out = model(x)
        ce = F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten(),
                             label_smoothing=self.train_cfg.label_smoothing)
        return ce + self.aux_loss_coef * out.aux_loss, y.numel()

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """{"val_loss" (nats per token), "perplexity", "bits_per_byte", "val_tokens"} on the validation
        text (data_cfg.eval_tokens of it, or all)."""
        total, count, n_bytes = 0.0, 0, 0
        for x, y in self.val.sequential_blocks(self.data_cfg.block_size, max_tokens=self.data_cfg.eval_tokens):
            logits = model(x).logits.float()
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
            if self.token_bytes is not None:
                n_bytes += int(self.token_bytes[y].sum())
        loss = total / count
        record = {"val_loss": round(loss, 4), "perplexity": round(math.exp(loss), 3), "val_tokens": count}
        if n_bytes:
            record["bits_per_byte"] = round(total / math.log(2) / n_bytes, 4)
        return record
