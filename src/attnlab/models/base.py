"""What every attnlab model shares."""
from __future__ import annotations

from torch import nn


class Model(nn.Module):
    """Base class of the model families: a module built from one config (`self.cfg`)."""

    is_recurrent = False  # True for a model that decodes with a constant-size state (Mamba), not a KV cache

    def num_parameters(self) -> int:
        """Parameters, tied ones counted once (parameters() yields a shared tensor once)."""
        return sum(p.numel() for p in self.parameters())
