"""Hugging Face MambaForCausalLM directories (config.json + safetensors) in and out.

Shape legend: V vocab, D model dim, Di inner width, N state size, K convolution width, R dt rank.

Config (transformers' MambaConfig <-> MambaConfig):
    hidden_size d_model · num_hidden_layers n_layers · state_size d_state · conv_kernel d_conv ·
    expand expand · time_step_rank dt_rank · time_step_{min,max,floor,scale} dt_{min,max,init_floor,scale} ·
    time_step_init_scheme dt_init · use_conv_bias conv_bias · use_bias bias · layer_norm_epsilon norm_eps ·
    residual_in_fp32 · rescale_prenorm_residual · tie_word_embeddings tie_embeddings ·
    initializer_range init_std · bos_token_id / eos_token_id bos_id / eos_id.
Accepted and not carried: use_mambapy, use_associative_scan (other ways to run the same scan),
use_cache, pad_token_id. Refused by name: any hidden_act but SiLU, a non-integer expand, an
intermediate_size other than expand · hidden_size, and any other architecture (Mamba-2, Falcon-Mamba, ...).
The model has no length limit, so no max_seq_len is read or written (MambaConfig's default is kept).
rescale_prenorm_residual is read as it is but always written false (hf_mamba_config says why): with
it true, transformers' from_pretrained divides the file's out_proj weights by √n_layers, so such a
directory gives transformers other logits than its own tensors; we load the tensors as stored.

Tensors (ours <-> theirs; layouts are the same, nn.Linear (out, in) and nn.Conv1d (Di, 1, K)):
    embed_tokens.weight (V, D)           backbone.embeddings.weight (old files: backbone.embedding.weight)
    layers.L.norm.weight (D,)            backbone.layers.L.norm.weight
    layers.L.mixer.P                     backbone.layers.L.mixer.P, for P in in_proj.{weight,bias} (2Di, D),
                                         conv1d.{weight,bias}, x_proj.weight (R + 2N, Di),
                                         dt_proj.{weight,bias} (Di, R), A_log (Di, N), D (Di,),
                                         out_proj.{weight,bias} (D, Di)
    norm.weight (D,)                     backbone.norm_f.weight
    lm_head.weight (V, D)                lm_head.weight (absent when tied)

Padding: transformers zeroes padded positions before in_proj and after the convolution; we zero the
convolution's input after in_proj and Δ as well. With use_bias=False (every released Mamba) the real
positions' logits are the same; with in_proj biases transformers lets the bias of padded positions
into the convolution, which we do not (a left-padded prompt then equals the prompt alone).

Source: transformers 5.24, models/mamba/{configuration,modeling}_mamba.py.
"""
from __future__ import annotations

from pathlib import Path

import torch

from attnlab import jsonfile
from attnlab.errors import UserError
from attnlab.files import atomic_directory
from attnlab.interop.hf import check_replaceable, tokenizer_config
from attnlab.interop.safetensors_dir import SINGLE, read_tensors, weight_files
from attnlab.interop.hf_weights import check_tensors
from attnlab.models.mamba import Mamba, MambaConfig
from attnlab.tensorfile import write_tensors

ARCHITECTURE, MODEL_TYPE = "MambaForCausalLM", "mamba"
# transformers 5.24's MambaConfig defaults for the fields read here when config.json leaves them out.
HF_DEFAULTS = dict(state_size=16, conv_kernel=4, expand=2, time_step_rank="auto", time_step_min=0.001,
                   time_step_max=0.1, time_step_floor=1e-4, time_step_scale=1.0, time_step_init_scheme="random",
                   use_conv_bias=True, use_bias=False, hidden_act="silu", layer_norm_epsilon=1e-5,
                   residual_in_fp32=True, rescale_prenorm_residual=False, tie_word_embeddings=True,
                   initializer_range=0.1, bos_token_id=0, eos_token_id=0)
_ACTIVATIONS = ("silu", "swish")


def _first(value):
    """An id, or the first of a list (transformers allows several eos ids; MambaConfig keeps one)."""
    return (value[0] if value else None) if isinstance(value, list) else value


def mamba_config_from_hf(hf: dict) -> MambaConfig:
    """A MambaConfig from a MambaForCausalLM config.json dict.

    Raises:
        ValueError: naming the architecture or field that is unsupported, missing or invalid.
    """
    archs, model_type = hf.get("architectures"), hf.get("model_type")
    if archs not in (None, [ARCHITECTURE]) or (archs is None and model_type != MODEL_TYPE):
        raise UserError(f"config.json is not a {ARCHITECTURE} (architectures={archs!r}, model_type={model_type!r})")
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k.endswith("token_id")}}
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if not isinstance(hf.get(k), int)]
    if missing:
        raise UserError(f"config.json lacks the integer size field(s) {missing}")
    if hf["hidden_act"] not in _ACTIVATIONS:
        raise UserError(f"hidden_act={hf['hidden_act']!r} is not supported (the Mamba block uses SiLU)")
    expand, d = hf["expand"], hf["hidden_size"]
    if not isinstance(expand, (int, float)) or isinstance(expand, bool) or expand != int(expand):
        raise UserError(f"expand={expand!r} is not supported (an integer; MambaConfig.expand is an int)")
    if hf.get("intermediate_size", int(expand * d)) != int(expand * d):
        raise UserError(f"intermediate_size={hf['intermediate_size']} differs from expand · hidden_size = "
                        f"{int(expand * d)}")
    fields = dict(vocab_size=hf["vocab_size"], d_model=d, n_layers=hf["num_hidden_layers"], d_state=hf["state_size"],
                  d_conv=hf["conv_kernel"], expand=int(expand), dt_rank=hf["time_step_rank"],
                  dt_min=hf["time_step_min"], dt_max=hf["time_step_max"], dt_init_floor=hf["time_step_floor"],
                  dt_scale=hf["time_step_scale"], dt_init=hf["time_step_init_scheme"], conv_bias=bool(hf["use_conv_bias"]),
                  bias=bool(hf["use_bias"]), norm_eps=hf["layer_norm_epsilon"],
                  residual_in_fp32=bool(hf["residual_in_fp32"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
                  init_std=float(hf["initializer_range"]), rescale_prenorm_residual=bool(hf["rescale_prenorm_residual"]),
                  bos_id=_first(hf["bos_token_id"]), eos_id=_first(hf["eos_token_id"]))
    try:
        return MambaConfig(**fields)
    except ValueError as err:
        raise UserError(f"config.json ({ARCHITECTURE}) maps to an invalid MambaConfig: {err}") from None


def hf_mamba_config(cfg: MambaConfig, dtype: torch.dtype = torch.float32) -> dict:
    """The config.json (as a dict) of the MambaForCausalLM equal to a Mamba with `cfg`.

    rescale_prenorm_residual is written false whatever cfg says: it is an initialisation setting, and
    transformers 5.24 applies it to loaded weights too (its _init_weights divides out_proj.weight by
    √n_layers in place after from_pretrained), which would change the saved model.
    """
    return dict(architectures=[ARCHITECTURE], model_type=MODEL_TYPE, vocab_size=cfg.vocab_size,
                hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, state_size=cfg.d_state,
                conv_kernel=cfg.d_conv, expand=cfg.expand, intermediate_size=cfg.d_inner,
                time_step_rank=cfg.delta_rank, time_step_min=cfg.dt_min, time_step_max=cfg.dt_max,
                time_step_floor=cfg.dt_init_floor, time_step_scale=cfg.dt_scale,
                time_step_init_scheme=cfg.dt_init, use_conv_bias=cfg.conv_bias, use_bias=cfg.bias,
                hidden_act="silu", layer_norm_epsilon=cfg.norm_eps, residual_in_fp32=cfg.residual_in_fp32,
                rescale_prenorm_residual=False, tie_word_embeddings=cfg.tie_embeddings,
                initializer_range=cfg.init_std, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id,
                use_cache=True, dtype=str(dtype).removeprefix("torch."))


def hf_name(name: str) -> str:
    """The MambaForCausalLM tensor name of one of our state-dict names (table in the module docstring)."""
    if name == "lm_head.weight":
        return name
    if name == "embed_tokens.weight":
        return "backbone.embeddings.weight"
    if name == "norm.weight":
        return "backbone.norm_f.weight"
    return "backbone." + name


def to_hf(state: dict[str, torch.Tensor], tie: bool) -> dict[str, torch.Tensor]:
    """Our state dict -> MambaForCausalLM tensors (contiguous; lm_head left out when tied)."""
    return {hf_name(k): v.detach().contiguous() for k, v in state.items() if not (tie and k == "lm_head.weight")}


def _normalize(tensors: dict[str, torch.Tensor], tie: bool) -> dict[str, torch.Tensor]:
    """Old files' backbone.embedding.weight renamed; a tied lm_head.weight that repeats the embeddings dropped.

    Raises:
        ValueError: when tied embeddings are declared but lm_head.weight differs from them.
    """
    tensors = {("backbone.embeddings.weight" if k == "backbone.embedding.weight" else k): v for k, v in tensors.items()}
    embed = tensors.get("backbone.embeddings.weight")
    if tie and "lm_head.weight" in tensors and embed is not None:
        head = tensors.pop("lm_head.weight")
        if head.shape != embed.shape or not torch.equal(head, embed):
            raise UserError("tie_word_embeddings is true but lm_head.weight differs from the token embeddings")
    return tensors


def load_mamba_hf(path, dtype: torch.dtype = torch.float32) -> tuple[Mamba, dict]:
    """Load a MambaForCausalLM directory into attnlab's Mamba.

    Args:
        path: a directory with config.json and model.safetensors (or an index and its shards).
        dtype: the parameters' dtype after loading.
    Returns:
        (model in eval mode, the config.json dict); its logits equal transformers' for the same
        input_ids (and a left-padding attention_mask; see the module docstring).
    Raises:
        FileNotFoundError: no directory, config.json or weights.
        ValueError: pickled weights only, an unsupported architecture or field (named), or tensors
            missing, unexpected or mis-shaped (listed with their shapes).
    Source: transformers 5.24, models/mamba.
    """
    folder = Path(path)
    files = weight_files(folder)
    hf = jsonfile.read_json(folder / "config.json")
    cfg = mamba_config_from_hf(hf)
    tensors = _normalize(read_tensors(files), cfg.tie_embeddings)
    model = Mamba(cfg)
    state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in to_hf(state, cfg.tie_embeddings).items()}
    check_tensors(expected, {k: tuple(v.shape) for k, v in tensors.items()}, str(files[0] if len(files) == 1 else folder))
    ours = {k: tensors[hf_name(k)] for k in state if not (cfg.tie_embeddings and k == "lm_head.weight")}
    if cfg.tie_embeddings:
        ours["lm_head.weight"] = ours["embed_tokens.weight"]
    with torch.no_grad():
        model.load_state_dict(ours)
    return model.to(dtype).eval(), hf


def save_mamba_hf(model: Mamba, out_dir, tokenizer=None) -> None:
    """Write a Mamba as a MambaForCausalLM directory (config.json, model.safetensors, and with a
    tokenizer tokenizer.json + tokenizer_config.json), atomically (files.atomic_directory).

    Args:
        model: the Mamba. out_dir: a new or empty directory, or an earlier save's output (replaced).
        tokenizer: a ByteLevelBPE (or anything with save(path), vocab_size, special_tokens, id_to_token).
    Raises:
        TypeError: model is not a Mamba.
        ValueError: a tokenizer larger than the vocabulary, or an out_dir holding other files.
    """
    if not isinstance(model, Mamba):
        raise TypeError(f"save_mamba_hf takes an attnlab Mamba, got {type(model).__name__}")
    cfg = model.cfg
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise UserError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                        f"{cfg.vocab_size}")
    tensors = {k: v.cpu() for k, v in to_hf(model.state_dict(), cfg.tie_embeddings).items()}
    out = Path(out_dir)
    check_replaceable(out)
    with atomic_directory(out, need=sum(t.numel() * t.element_size() for t in tensors.values())) as tmp:
        write_tensors(tmp / SINGLE, tensors, {"format": "pt"})
        jsonfile.write_json_atomic(tmp / "config.json", hf_mamba_config(cfg, model.embed_tokens.weight.dtype))
        if tokenizer is not None:
            tokenizer.save(tmp / "tokenizer.json")
            jsonfile.write_json_atomic(tmp / "tokenizer_config.json", tokenizer_config(tokenizer, cfg))
