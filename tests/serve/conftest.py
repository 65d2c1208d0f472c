"""Live servers for the tests: `python -m attnlab serve` in a subprocess on 127.0.0.1, any free port
(the port is read from the line the server prints), on the tiny GGUF chat model of tiny.py."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'attnlab[serve]')")
pytest.importorskip("gguf", reason="the tiny model is written as GGUF (the hf extra)")

from tests.serve.tiny import tiny_chat_gguf  # noqa: E402

CTX = 32768  # positions per slot of the shared server: room for requests that run long enough to be cut
LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")


class LiveServer:
    """`attnlab serve ARGS --port 0` in a subprocess, its stderr collected in `log`.

    Attributes: url (http://127.0.0.1:PORT), base_url (url + /v1), model (the id it serves).
    """

    def __init__(self, model: str, *args: str, timeout: float = 180):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.model = model
        self.proc = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", "--model", model, "--port", "0",
                                      "--threads", "1", *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=env)
        self.log: list[str] = []
        self.url = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                found = LISTENING.search(line)
                if found and self.url is None:
                    self.url = found.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.url is None:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.log))
        self.base_url = self.url + "/v1"

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def text_log(self) -> str:
        return "".join(self.log)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny-chat.gguf"
    tiny_chat_gguf(path)
    return path


def has_minilm() -> bool:
    try:
        from attnlab.pretrained import resolve
        resolve("all-minilm-l6-v2")
        return True
    except FileNotFoundError:
        return False


@pytest.fixture(scope="session")
def server(tiny_gguf):
    """The shared server: the tiny chat model (16 slots of CTX positions) and, when installed,
    all-MiniLM-L6-v2 for embeddings."""
    extra = ["--embed-model", "all-minilm-l6-v2"] if has_minilm() else []
    live = LiveServer(str(tiny_gguf), "--max-batch", "16", "--ctx-size", str(CTX), *extra)
    yield live
    assert live.stop() == 0, live.text_log()
    assert "Traceback" not in live.text_log(), live.text_log()


def wait_until(predicate, timeout: float = 10, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False
