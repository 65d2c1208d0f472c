"""GPT.for_loading: a model built without its random initialisation (for the GGUF and Hugging Face
loaders) is GPT(cfg) once every parameter is loaded: the same buffers, the same tied weights, the
same logits, for every preset and position kind."""
import pytest
import torch

from attnlab.models.gpt import GPT
from tests.models.test_gpt import PRESETS, ids, model_for, tiny

CASES = [(p, {}) for p in PRESETS] + [("gpt2", {"positions": "sinusoidal"}), ("llama", {"tie_embeddings": True}),
                                       ("llama", {"tie_embeddings": False})]


@pytest.mark.parametrize("preset,kw", CASES)
def test_a_model_built_for_loading_is_the_initialised_one_once_loaded(preset, kw):
    ref = model_for(preset, **kw)
    model = GPT.for_loading(tiny(preset, **kw))
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    model.load_state_dict(ref.state_dict())
    model.eval()
    assert dict(model.named_buffers()).keys() == dict(ref.named_buffers()).keys()
    for (name, a), (_, b) in zip(ref.named_buffers(), model.named_buffers()):
        assert torch.equal(a, b), name  # the non-persistent ones are not in the state dict: made again
    if ref.cfg.tie_embeddings:
        assert model.lm_head.weight is model.embed_tokens.weight
    else:
        assert model.lm_head.weight is not model.embed_tokens.weight
    x = ids(2, 9)
    with torch.no_grad():
        assert torch.equal(model(x).logits, ref(x).logits)


def test_loading_touches_no_random_generator():
    """No initialiser draws from the global generator (the point of building on the meta device)."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    GPT.for_loading(tiny("llama"))
    assert torch.equal(torch.get_rng_state(), before)
