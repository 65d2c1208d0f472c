"""BERT checkpoints in the Hugging Face layout: load into models.bert.Bert, save back.

HF names (with or without the "bert." prefix of the task models) ↔ ours:
    embeddings.{word,position,token_type}_embeddings   embed_{tokens,positions,segments}
    embeddings.LayerNorm                               embed_norm
    encoder.layer.N.attention.self.{query,key,value}   layers.N.self_attn.{q,k,v}_proj
    encoder.layer.N.attention.output.dense / LayerNorm layers.N.self_attn.out_proj / attn_norm
    encoder.layer.N.intermediate.dense / output.dense  layers.N.ffn.up_proj / down_proj
    encoder.layer.N.output.LayerNorm                   layers.N.ffn_norm
    pooler.dense                                       pooler
    cls.predictions.transform.dense / LayerNorm / bias mlm_transform / mlm_norm / mlm_bias
    classifier                                         classifier
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from attnlab.data.wordpiece import load_wordpiece
from attnlab.errors import UserError
from attnlab.files import atomic_directory
from attnlab.interop.safetensors_dir import read_safetensors_dir
from attnlab.jsonfile import read_json
from attnlab.models.bert import Bert, BertConfig
from attnlab.pretrained import resolve
from attnlab.tensorfile import write_tensors

_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_LAYER = {"attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
          "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
          "attention.output.LayerNorm": "attn_norm", "intermediate.dense": "ffn.up_proj",
          "output.dense": "ffn.down_proj", "output.LayerNorm": "ffn_norm"}
_TOP = {"embeddings.word_embeddings": "embed_tokens", "embeddings.position_embeddings": "embed_positions",
        "embeddings.token_type_embeddings": "embed_segments", "embeddings.LayerNorm": "embed_norm",
        "pooler.dense": "pooler"}
_HEADS = {"cls.predictions.transform.dense": "mlm_transform", "cls.predictions.transform.LayerNorm": "mlm_norm",
          "classifier": "classifier"}
OPTIONAL = ("pooler.", "mlm_", "classifier.")  # heads a plain encoder checkpoint may lack


def bert_config_from_hf(hf: dict, special_ids: dict[str, int] | None = None) -> BertConfig:
    """A BertConfig from a HF BERT config.json dict (special ids from the tokenizer, if given).

    Raises:
        ValueError: naming an option our BERT does not implement.
    """
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported (absolute only)")
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise UserError(f"hidden_act {act!r} is not supported; supported: {sorted(_ACTS)}")
    labels = hf.get("id2label")
    ids = special_ids or {}
    return BertConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"], max_seq_len=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2), activation=_ACTS[act], norm_eps=hf.get("layer_norm_eps", 1e-12),
        dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        n_labels=len(labels) if labels else hf.get("num_labels", 2), pad_id=hf.get("pad_token_id", 0) or 0,
        cls_id=ids.get("[CLS]"), sep_id=ids.get("[SEP]"), mask_id=ids.get("[MASK]"))


def hf_to_ours(name: str) -> str | None:
    """Our parameter name for a HF BERT tensor name (None for buffers such as position_ids)."""
    if name.startswith("bert."):
        name = name[len("bert."):]
    if name in ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
        return None  # a buffer; the decoder is tied to the word embeddings and shares cls.predictions.bias
    if name == "cls.predictions.bias":
        return "mlm_bias"
    stem, _, leaf = name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{leaf}"
    if stem in _HEADS:
        return f"{_HEADS[stem]}.{leaf}"
    if stem.startswith("encoder.layer."):
        index, _, rest = stem[len("encoder.layer."):].partition(".")
        if rest in _LAYER:
            return f"layers.{index}.{_LAYER[rest]}.{leaf}"
    raise UserError(f"unexpected tensor {name!r} in a BERT checkpoint")


def ours_to_hf(name: str) -> str:
    """The HF BertForMaskedLM / BertForSequenceClassification name of one of our parameters."""
    if name == "mlm_bias":
        return "cls.predictions.bias"
    stem, _, leaf = name.rpartition(".")
    for table, prefix in ((_TOP, "bert."), (_HEADS, "")):
        for hf_stem, ours in table.items():
            if stem == ours:
                return f"{prefix}{hf_stem}.{leaf}"
    index, _, rest = stem[len("layers."):].partition(".")
    hf_rest = next(k for k, v in _LAYER.items() if v == rest)
    return f"bert.encoder.layer.{index}.{hf_rest}.{leaf}"


def load_bert_state(model: Bert, tensors: dict[str, torch.Tensor], source: str) -> list[str]:
    """Copy HF-named tensors into `model`. Returns the optional heads the checkpoint lacked.

    Raises:
        ValueError: listing missing required tensors and shape mismatches (name, ours, theirs).
    """
    own = model.state_dict()
    mapped = {}
    for name, tensor in tensors.items():
        ours = hf_to_ours(name)
        if ours is not None:
            mapped[ours] = tensor
    bad = [f"{k}: ours {tuple(own[k].shape)}, file {tuple(v.shape)}" for k, v in mapped.items()
           if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in mapped and not k.startswith(OPTIONAL)]
    if bad or missing:
        raise UserError(f"{source}: " + "; ".join(
            ([f"missing tensors {missing}"] if missing else []) + ([f"shape mismatches {bad}"] if bad else [])))
    model.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in mapped.items() if k in own}})
    return sorted({k.split(".")[0] for k in own if k not in mapped})


def bert_hf_config(cfg: BertConfig) -> dict:
    """The HF config.json dict of our BertConfig."""
    acts = {v: k for k, v in _ACTS.items() if k != "gelu_pytorch_tanh"}
    return {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "intermediate_size": cfg.ffn_dim, "max_position_embeddings": cfg.max_seq_len,
            "type_vocab_size": cfg.type_vocab_size, "hidden_act": acts[cfg.activation], "layer_norm_eps": cfg.norm_eps,
            "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.attention_dropout,
            "pad_token_id": cfg.pad_id, "num_labels": cfg.n_labels, "position_embedding_type": "absolute",
            "tie_word_embeddings": True}


def save_bert_hf(model: Bert, out_dir: str | Path, tokenizer_json: str | Path | None = None) -> Path:
    """Write `model` as a HF BERT directory (config.json, model.safetensors[, tokenizer.json]) that
    transformers' BertModel / BertForMaskedLM / BertForSequenceClassification load; atomically
    (files.atomic_directory)."""
    out = Path(out_dir)
    tensors = {ours_to_hf(k): v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    with atomic_directory(out, need=sum(t.numel() * t.element_size() for t in tensors.values())) as tmp:
        write_tensors(tmp / "model.safetensors", tensors, {"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(bert_hf_config(model.cfg), indent=2))
        if tokenizer_json is not None:
            shutil.copyfile(tokenizer_json, tmp / "tokenizer.json")
    return out


def load_hf_bert(name_or_path: str) -> tuple[Bert, object, Path, int]:
    """A BERT encoder in the HF layout (config.json, model.safetensors, tokenizer.json), by path or
    by pretrained name (all-minilm-l6-v2).

    Returns:
        (model in eval mode, WordPiece tokenizer, its tokenizer.json, the longest input its pooling
        config allows (sentence_bert_config.json's max_seq_length, else max_seq_len)).
    Raises:
        FileNotFoundError, ValueError: naming what is missing or unsupported.
    """
    path = resolve(name_or_path)
    if not path.is_dir():
        raise UserError(f"{name_or_path} is a single file (GGUF, a language model); a BERT encoder is a directory "
                        f"such as all-minilm-l6-v2")
    config = read_json(path / "config.json")
    if config.get("model_type") != "bert":
        raise UserError(f"{path}: model_type {config.get('model_type')!r} is not an encoder this loads (bert)")
    tokenizer = load_wordpiece(path / "tokenizer.json")
    special = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")
               if tokenizer.token_to_id(t) is not None}
    model = Bert(bert_config_from_hf(config, special))
    load_bert_state(model, read_safetensors_dir(path), str(path))
    limit = None
    if (path / "sentence_bert_config.json").is_file():
        limit = read_json(path / "sentence_bert_config.json").get("max_seq_length")
    return model.eval(), tokenizer, path / "tokenizer.json", limit or model.cfg.max_seq_len
