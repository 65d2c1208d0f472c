import json
from pathlib import Path

import pytest
import torch

from attnlab.models.bert import BertConfig
from attnlab.interop.hf_bert import bert_config_from_hf, load_bert_state, save_bert_hf
from attnlab.interop.safetensors_dir import read_safetensors_dir
from attnlab.models.bert import Bert, mean_pool

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def batch():
    ids = torch.tensor([[2, 5, 9, 11, 3, 0, 0], [2, 7, 8, 9, 10, 12, 3]])
    return ids, (ids != 0).long(), torch.tensor([[0, 0, 0, 1, 1, 0, 0], [0] * 7])


def load_ours(path: Path) -> Bert:
    model = Bert(bert_config_from_hf(json.loads((path / "config.json").read_text())))
    load_bert_state(model, read_safetensors_dir(path), str(path))
    return model.eval()


def test_hf_bert_loads_with_equal_hidden_states_mlm_logits_and_pooler(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_ours(tmp_path)
    ids, mask, segments = batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments, output_hidden_states=True)
        hidden = ours(ids, mask, segments)
        real = mask.bool()
        assert (hidden[real] - ref.hidden_states[-1][real]).abs().max() < 1e-5
        assert (ours.mlm_logits(hidden)[real] - ref.logits[real]).abs().max() < 1e-4


def test_bert_model_with_pooler_loads(tmp_path):
    torch.manual_seed(1)
    hf = transformers.BertModel(transformers.BertConfig(**TINY)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_ours(tmp_path)
    ids, mask, segments = batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments)
        assert (ours.pooled(ours(ids, mask, segments)) - ref.pooler_output).abs().max() < 1e-5


def test_our_bert_exports_to_transformers_with_equal_outputs(tmp_path):
    torch.manual_seed(2)
    ours = Bert(BertConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, max_seq_len=40, dropout=0.0,
                           attention_dropout=0.0, n_labels=3, cls_id=2, sep_id=3, mask_id=4)).eval()
    with torch.no_grad():
        ours.mlm_bias.normal_()  # non-trivial head weights
    save_bert_hf(ours, tmp_path / "hf")
    ids, mask, segments = batch()
    mlm = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    cls = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        hidden = ours(ids, mask, segments)
        real = mask.bool()
        assert (mlm(ids, attention_mask=mask, token_type_ids=segments).logits[real]
                - ours.mlm_logits(hidden)[real]).abs().max() < 1e-4
        assert (cls(ids, attention_mask=mask, token_type_ids=segments).logits - ours.classify(hidden)).abs().max() < 1e-5
    again = load_ours(tmp_path / "hf")
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_bad_checkpoints_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="position_embedding_type"):
        bert_config_from_hf({**{k: v for k, v in TINY.items()}, "position_embedding_type": "relative_key"})
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**TINY))
    hf.save_pretrained(tmp_path / "m")
    tensors = read_safetensors_dir(tmp_path / "m")
    ours = Bert(bert_config_from_hf(TINY))
    broken = {k: v for k, v in tensors.items() if "layer.1.output.dense.weight" not in k}
    with pytest.raises(ValueError, match=r"missing tensors \['layers.1.ffn.down_proj.weight'\]"):
        load_bert_state(ours, broken, "m")
    reshaped = {**tensors, "embeddings.word_embeddings.weight": torch.zeros(61, 32)}
    with pytest.raises(ValueError, match=r"embed_tokens.weight: ours \(60, 32\), file \(61, 32\)"):
        load_bert_state(ours, reshaped, "m")
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ValueError, match="pickled weights"):
        read_safetensors_dir(tmp_path / "pickled")


def test_mean_pool_ignores_padding_and_normalises():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])
    out = mean_pool(hidden, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0]]) / 8 ** 0.5)
