"""The interactive attention page: self-contained, and rendered by a real browser (headless Chromium)
with one element per token, no script error, and hovering showing one token's row."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from attnlab.viz import attention
from attnlab.viz.attention_html import attention_page, write_attention_page
from tests.viz.conftest import tiny_gpt

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def maps(pair_tokenizer):
    return attention.attention_maps(tiny_gpt(pair_tokenizer), "Two red dogs sit on the street.")


def test_page_is_self_contained(maps):
    page = attention_page(maps, 1, 2, "a caption with </script> inside")
    assert "http" not in page and "src=" not in page and "<link" not in page
    assert page.count("<script") == 2  # the data and the code, both inline
    assert "</script> inside" not in page  # escaped text cannot close the script


def _render(path, fragment: str) -> str:
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                           "--dump-dom", f"file://{path}#{fragment}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_chromium_renders_one_element_per_token_and_no_error(maps, tmp_path):
    path = write_attention_page(maps, tmp_path / "page.html", 1, 2)
    t, s = maps.weights.shape[2:]
    dom = _render(path, "layer=1&head=3&focus=4")
    assert len(re.findall(r'class="tok q[ "]', dom)) == t
    assert len(re.findall(r'class="tok k[ "]', dom)) == s
    assert re.search(r'<div id="errors"></div>', dom), "the page reported a script error"
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert 'data-ready="1"' in body and 'data-layer="1"' in body and 'data-head="3"' in body
    drawn = int(re.search(r'data-lines="(\d+)"', body).group(1))
    assert drawn == int((maps.weights.round(4)[1, 3, 4] >= 0.01).sum())  # hovering token 4 shows its row alone
    assert 'data-focus="q4"' in body and re.search(r'class="tok q on"[^>]*data-index="4"', dom)
    everything = _render(path, "layer=0&head=mean")
    lines = int(re.search(r'data-lines="(\d+)"', everything).group(1))
    assert lines == int((maps.weights.round(4)[0].astype(np.float64).mean(0) >= 0.01).sum())
