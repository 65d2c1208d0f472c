"""nanoGPT's training step, as its train.py runs it, for bench/train_step.py's side-by-side timing.

The model is nanoGPT's own `model.py` (../shared/peers/nanogpt, unchanged, MIT) built with the CPU
"baby GPT" settings of its README (block 64, batch 12, 4 layers, 4 heads, 128 wide, no dropout, no
biases) at the vocabulary of our character recipe; its optimizer comes from its own
configure_optimizers (AdamW, weight decay 0.1, β2 0.99; on a CPU torch's default for-loop kernel).
One step is the body of train.py's loop: set the learning rate of every group, forward with the
targets (its cross-entropy), fetch the next batch (its get_batch: a fresh np.memmap of train.bin,
12 random offsets, torch.stack of int64 copies), backward, clip the gradient norm to 1.0, the
optimizer step, zero_grad(set_to_none=True), loss.item() (log_interval=1, as the peer script runs it).
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

from _common import SHARED

NANOGPT = SHARED / "peers" / "nanogpt"


def _model_module():
    spec = importlib.util.spec_from_file_location("nanogpt_model", NANOGPT / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NanoGPTStep:
    """Callable: one nanoGPT training iteration on `train_ids` (a 1-D int tensor of token ids, our
    training split), with a model of `vocab_size` tokens. `workdir` holds its train.bin."""

    def __init__(self, train_ids: torch.Tensor, vocab_size: int, workdir: Path, block_size: int = 64,
                 batch_size: int = 12, seed: int = 0):
        nanogpt = _model_module()
        self.path = Path(workdir) / "train.bin"
        train_ids.numpy().astype(np.uint16).tofile(self.path)
        self.block_size, self.batch_size = block_size, batch_size
        torch.manual_seed(seed)
        cfg = nanogpt.GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=4, n_head=4, n_embd=128,
                                dropout=0.0, bias=False)
        with contextlib.redirect_stdout(sys.stderr):  # it prints its parameter counts
            self.model = nanogpt.GPT(cfg)
            self.optimizer = self.model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
        self.model.train()
        self.x, self.y = self.get_batch()

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """train.py's get_batch('train') on the CPU."""
        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - self.block_size, (self.batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i + self.block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + self.block_size]).astype(np.int64)) for i in ix])
        return x, y

    def __call__(self, lr: float = 1e-3) -> tuple[float, int]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _, loss = self.model(self.x, self.y)
        self.x, self.y = self.get_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item(), self.batch_size * self.block_size
