"""moe: a tiny mixture-of-experts model trained here on Tiny Shakespeare routes every token to top_k
experts per layer, exactly as its MoE layers choose them."""
import pytest
import torch

from attnlab.data.datasets import DatasetNotFoundError
from attnlab.data.text import char_tokenizer
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.moe import MixtureOfExperts
from attnlab.viz import moe
from attnlab.viz.capture import recorded_routing
from attnlab.viz.sources import Source, shakespeare_text
from attnlab.tasks.loaded import LoadedModel
from attnlab.tasks.registry import get_task
from tests.viz.conftest import tiny_gpt


@pytest.fixture(scope="module")
def trained_moe():
    try:
        text = shakespeare_text(20000)
    except DatasetNotFoundError as err:
        pytest.skip(f"Tiny Shakespeare is not available: {err}")
    tok = char_tokenizer(text)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=32,
                          n_experts=4, moe_top_k=2))
    ids = torch.tensor(tok.encode(text))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(40):  # a few steps: enough for the router to stop being uniform noise
        starts = torch.randint(0, len(ids) - 33, (8,))
        batch = torch.stack([ids[s:s + 33] for s in starts])
        out = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten()) + out.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return Source(LoadedModel(model.eval(), tok, get_task("gpt"), None), "tiny-moe"), text


def test_every_token_goes_to_top_k_experts_per_layer(trained_moe, tmp_path):
    source, text = trained_moe
    r = moe.moe_routing(source, text[:100])  # 100 tokens: four windows of the 32-token context
    assert r.counts.shape == (2, 4) and (r.counts.sum(axis=1) == 100 * 2).all()
    assert r.first_choice.shape == (2, 100) and 0 < r.consistency <= 1
    moe.draw_moe(r, tmp_path / "m.png")


def test_recorded_choices_are_the_experts_the_layer_uses(trained_moe):
    source, text = trained_moe
    layer = source.model.layers[1].ffn
    assert isinstance(layer, MixtureOfExperts)
    seen = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0].detach())),
             layer.register_forward_hook(lambda m, args, out: seen.__setitem__("y", out[0].detach()))]
    with torch.no_grad(), recorded_routing(source.model) as records:
        source.model(torch.tensor([source.tokenizer.encode(text[:32])]))
    for h in hooks:
        h.remove()
    x, y, chosen = seen["x"][0], seen["y"][0], records[1]  # (N, D), (N, D), (N, k)
    with torch.no_grad():  # Mixtral's eq. (1): only the chosen experts, weights renormalised over them
        probs = layer.router(x).softmax(-1)
        for n in range(x.size(0)):
            w = probs[n, chosen[n]] / probs[n, chosen[n]].sum()
            expected = sum(w[j] * layer.experts[int(e)](x[n:n + 1])[0] for j, e in enumerate(chosen[n]))
            torch.testing.assert_close(y[n], expected, atol=1e-5, rtol=1e-4)


def test_needs_a_moe_model(pair_tokenizer):
    with pytest.raises(ValueError, match="needs a mixture-of-experts run, e.g. attnlab train --recipe shakespeare"):
        moe.moe_routing(tiny_gpt(pair_tokenizer), "text")
