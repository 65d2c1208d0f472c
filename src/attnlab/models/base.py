"""What every attnlab model shares."""
from __future__ import annotations

from torch import nn


class Model(nn.Module):
    """Base class of the model families: a module built from one config (`self.cfg`)."""

    def num_parameters(self) -> int:
        """Parameters, tied ones counted once (parameters() yields a shared tensor once)."""
        return sum(p.numel() for p in self.parameters())
