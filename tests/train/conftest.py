"""Session fixtures of the distributed tests: the tiny data as a folder, and the runs several tests
compare with (made once, on first use)."""
from __future__ import annotations

import pytest
import torch

from tests.train.distributed_runs import LM, TRANSLATION, make_data, one_process, torchrun

ARGS = {"translation": TRANSLATION, "lm": LM}


class Runs:
    """Runs of 5 steps made on first use: one process (`one`), and two processes (`two`)."""

    def __init__(self, root, data):
        self.root, self.data, self._made = root, data, {}

    def one(self, kind: str):
        out = self.root / f"one-{kind}"
        if out not in self._made:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                with pytest.MonkeyPatch.context() as mp:
                    one_process(mp, self.data, [*ARGS[kind], "--steps", "5", "--out", str(out)])
            finally:
                torch.set_num_threads(threads)
            self._made[out] = None
        return out

    def two(self, kind: str, parallel: str):
        out = self.root / f"two-{kind}-{parallel}"
        if out not in self._made:
            self._made[out] = torchrun(self.data, [*ARGS[kind], "--set", f"parallel={parallel}", "--steps", "5",
                                                   "--out", str(out)])
            assert self._made[out].returncode == 0, self._made[out].stderr[-3000:]
        return out, self._made[out]


@pytest.fixture(scope="session")
def dist_data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("dist-data"))


@pytest.fixture(scope="session")
def runs(tmp_path_factory, dist_data):
    return Runs(tmp_path_factory.mktemp("dist-runs"), dist_data)
