"""masks: the figure's masks are nn/masks.py's, and the very masks the encoder–decoder passes to its
attention modules for the same batch."""
import numpy as np
import torch

from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.viz import masks
from attnlab.viz.capture import attention_modules
from tests.conftest import make_pairs


def _captured_masks(model, src, tgt_in):
    """The mask argument each attention module of the model receives in one teacher-forced pass."""
    seen = {}
    handles = []
    for part in ("self", "decoder", "cross"):
        module = attention_modules(model, part)[0]
        handles.append(module.register_forward_pre_hook(
            lambda mod, args, kwargs, part=part: seen.__setitem__(part, kwargs["mask"]), with_kwargs=True))
    with torch.no_grad():
        model(src, tgt_in)
    for h in handles:
        h.remove()
    return seen


def test_masks_equal_nn_masks_and_what_the_model_uses(tiny_seq2seq, tmp_path):
    pairs = make_pairs(5, seed=3)
    tok = tiny_seq2seq.tokenizer
    r = masks.batch_masks(tok, [e for e, _ in pairs], [d for _, d in pairs], 0, 1, window_size=3)
    src, tgt_in = torch.tensor(r.src), torch.tensor(r.tgt_in)
    b, s, t = src.size(0), src.size(1), tgt_in.size(1)
    np.testing.assert_array_equal(r.encoder, padding_mask(src, 0).expand(b, 1, s, s)[:, 0].numpy())
    np.testing.assert_array_equal(r.decoder, (causal_mask(t) & padding_mask(tgt_in, 0))[:, 0].numpy())
    np.testing.assert_array_equal(r.window, causal_mask(t, window=3)[0, 0].numpy())
    used = _captured_masks(tiny_seq2seq.model, src, tgt_in)
    np.testing.assert_array_equal(r.encoder, used["self"].expand(b, 1, s, s)[:, 0].numpy())
    np.testing.assert_array_equal(r.decoder, used["decoder"].expand(b, 1, t, t)[:, 0].numpy())
    np.testing.assert_array_equal(r.cross, used["cross"].expand(b, 1, t, s)[:, 0].numpy())
    # the convention: True = may attend; a padded key is hidden, the future is hidden
    lengths = (r.src != 0).sum(1)
    assert lengths[r.row] == lengths.min()  # the sentence drawn is the most padded one
    for i, n in enumerate(lengths):
        assert r.encoder[i, :, :n].all() and not r.encoder[i, :, n:].any()
    assert not r.decoder[:, 0, 1:].any() and r.window[5, 3:6].all() and not r.window[5, :3].any()
    masks.draw_masks(r, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 1000
