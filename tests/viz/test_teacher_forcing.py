"""teacher-forcing: position 0 of the parallel pass is greedy decoding's first token; the
predictions are the argmax of the model's teacher-forced logits."""
import pytest
import torch

from attnlab.viz import teacher_forcing


def test_position_zero_equals_greedy_first_token(tiny_seq2seq, tmp_path):
    for seed in range(3):  # several random models: the property holds for any weights
        torch.manual_seed(seed)
        for p in tiny_seq2seq.model.parameters():
            torch.nn.init.normal_(p, std=0.3)
        r = teacher_forcing.teacher_forcing(tiny_seq2seq, "Two dogs sit on the street.",
                                            "Zwei hund sitzt auf der straße.")
        assert r.predicted_ids[0] == r.greedy_ids[0]
    tok = tiny_seq2seq.tokenizer
    src = torch.tensor([tok.encode("Two dogs sit on the street.")])
    tgt_in = torch.tensor([[1] + tok.encode("Zwei hund sitzt auf der straße.")])
    with torch.no_grad():
        assert r.predicted_ids == tiny_seq2seq.model(src, tgt_in)[0].argmax(-1).tolist()
    assert r.decoder_input[0] == "<bos>" and r.target[-1] == "<eos>"
    assert r.decoder_input[1:] == r.target[:-1]  # the input is the target shifted right
    teacher_forcing.draw_teacher_forcing(r, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_needs_a_translation_model(minilm):
    with pytest.raises(ValueError, match="needs a translation run"):
        teacher_forcing.teacher_forcing(minilm, "a", "b")
