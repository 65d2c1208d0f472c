"""Fine-tuning a pretrained decoder-only LLM on instruction pairs with LoRA adapters (nn/lora.py), or
every weight (a full fine-tune: lora_rank 0): the model config (which base, which adapters), the
data config, and the task (train / load / evaluate / export a run).

A LoRA run directory is also a PEFT adapter directory:
    config.json                {"model_type": "finetune", "recipe", "model", "data", "train",
                                "base_model": the base's GPTConfig (checked when the run is loaded)}
    adapter_config.json        PEFT's LoraConfig; base_model_name_or_path = the base as given
    adapter_model.safetensors  the best adapters, PEFT's key names (interop/peft.py)
    tokenizer.json, tokenizer_config.json   the base's tokenizer and chat template
    metrics.jsonl, checkpoint/ the adapters and their optimizer state only
A full fine-tune's holds model.safetensors (every weight) instead of the two adapter files.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Optional

from attnlab.chat import stop_tokens
from attnlab.config import Config, check, check_literals
from attnlab.data.instructions import InstructionExamples
from attnlab.data.translation import read_parallel
from attnlab.errors import UserError
from attnlab.interop.peft import (AdapterSettings, adapter_config, hf_module_name, load_adapter, read_adapter_config,
                                  save_adapter_weights)
from attnlab.jsonfile import write_json_atomic
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.lora import TARGETS, apply_lora, check_targets, lora_layers, merge_lora, trainable_parameters
from attnlab.nn.quant import SCHEMES
from attnlab.nn.quant_linear import QuantLinear
from attnlab.tasks.base import Prepared, RunSpec, Task
from attnlab.tasks.finetune_base import TOKENIZER_CONFIG, base_name, load_base, read_chat_template
from attnlab.tasks.instruction import InstructionObjective, render_pair, translation_bleu
from attnlab.tasks.kinds import Kind
from attnlab.tasks.language_model import special_strings
from attnlab.tasks.loaded import LoadedModel
from attnlab.tokenizers import ByteLevelBPE
from attnlab.train import distributed
from attnlab.train.checkpoint import load_weights
from attnlab.train.run_dir import ADAPTER_CONFIG, WEIGHTS, check_model_dir

log = logging.getLogger("attnlab")


@dataclass
class FinetuneConfig(Config):
    """Which pretrained model a fine-tune starts from, at which precision its frozen weights stay, and
    its LoRA adapters (Hu et al. 2021; rank 0: train every weight instead)."""

    model_type: ClassVar[str] = "finetune"  # the run's kind (tasks/registry.py)

    base: str = "smollm2-135m"        # the base: a pretrained name, a .gguf file, a HF directory or a GPT run
    base_dtype: Literal["auto", "fp32", "bf16", "q8_0", "q4_0", "q4_1"] = "fp32"  # the frozen base's weights:
                                      # fp32; a block quantization (QLoRA); "auto" = as stored (a GGUF's blocks)
    lora_rank: int = 8                # r of every adapter; 0 = full fine-tune (every weight trained, no adapter)
    lora_alpha: float = 16.0          # α: the update is scaled by α / r
    lora_dropout: float = 0.0         # dropout on the adapters' input (training only)
    lora_targets: str = ",".join(TARGETS)  # comma-separated layers to adapt (q_proj ... down_proj)
    use_rslora: bool = False          # scale by α / √r instead (rank-stabilised LoRA, PEFT's use_rslora)
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward pass: the
                                      # activation memory of one layer, for one more forward pass per step

    def __post_init__(self):
        check_literals(self)
        check(isinstance(self.base, str) and self.base.strip() != "", "base", "a model name or path", self.base)
        check(self.lora_rank >= 0, "lora_rank", ">= 0 (0 = full fine-tune)", self.lora_rank)
        check(self.lora_alpha > 0, "lora_alpha", "> 0", self.lora_alpha)
        check(0.0 <= self.lora_dropout < 1.0, "lora_dropout", "in [0, 1)", self.lora_dropout)
        try:
            check_targets(self.targets)
        except UserError:
            raise UserError(f"lora_targets must be a comma-separated list of {', '.join(TARGETS)}, "
                             f"got {self.lora_targets!r}") from None
        quantized = self.base_dtype in SCHEMES or self.base_dtype == "auto"
        check(self.lora_rank > 0 or not quantized, "base_dtype", "fp32 or bf16 for a full fine-tune (lora_rank=0: "
              "quantized weights cannot be trained)", self.base_dtype)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())

    def adapter_settings(self) -> AdapterSettings:
        """The run's adapters as PEFT describes them (adapter_config.json)."""
        return AdapterSettings(self.lora_rank, self.lora_alpha, list(self.targets), self.lora_dropout,
                               self.use_rslora, self.base)


@dataclass
class InstructionDataConfig(Config):
    """The instruction pairs a fine-tune trains on (Multi30k sentence pairs as translation
    instructions), how they are rendered, batched and scored."""

    dataset: Literal["multi30k"] = "multi30k"  # pairs from this data set (data/datasets.py)
    src_lang: Literal["en", "de", "fr"] = "en"  # the instruction's sentence
    tgt_lang: Literal["en", "de", "fr"] = "de"  # the response: the reference translation
    instruction: str = "Translate to German: {source}"  # the user's turn; {source} = the source sentence
    system: Optional[str] = None      # a system message; None = the chat template's own default
    max_len: int = 256                # pairs longer than this many tokens (prompt + response) are left out
    batch_tokens: int = 1024          # padded tokens per batch (examples of similar length together)
    label_smoothing: float = 0.0      # ε_ls of the response tokens' loss
    share_prefix: bool = True         # compute the prompt prefix a batch shares once (nn/prefix_kv.py)
    n_train: Optional[int] = None     # train on the first N pairs only (None = all)
    eval_sentences: int = 100         # validation pairs scored (loss, greedy BLEU) at each evaluation
    test_split: Literal["test_2016_flickr"] = "test_2016_flickr"  # the split `evaluate --split test` reads
    max_new_tokens: int = 96          # longest completion decoded at evaluation
    beam_size: int = 1                # evaluate's default beam (1 = greedy)
    length_penalty: float = 0.6       # α of beam search's length penalty

    def __post_init__(self):
        check_literals(self)
        check(self.src_lang != self.tgt_lang, "tgt_lang", f"different from src_lang={self.src_lang!r}", self.tgt_lang)
        check("{source}" in self.instruction, "instruction", "a text holding {source}", self.instruction)
        for name in ("max_len", "batch_tokens", "eval_sentences", "max_new_tokens"):
            check(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        check(self.n_train is None or self.n_train >= 1, "n_train", "None or >= 1", self.n_train)
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)", self.label_smoothing)
        check(1 <= self.beam_size <= 64, "beam_size", "in 1..64", self.beam_size)
        check(self.length_penalty >= 0, "length_penalty", ">= 0", self.length_penalty)


def _examples(base_tokenizer, template: str, special: dict, data: InstructionDataConfig, split: str, stop: int | None,
              limit: int | None = None) -> tuple[InstructionExamples, list[str], int]:
    """(tokenized pairs of `split`, their references, how many were too long) (module docstring)."""
    src, tgt = read_parallel(data.dataset, split, data.src_lang, data.tgt_lang)
    src, tgt = src[:limit], tgt[:limit]
    texts = [render_pair(template, special, data.instruction.format(source=s), t, data.system) for s, t in zip(src, tgt)]
    examples, dropped = InstructionExamples.encode(base_tokenizer, [p for p, _ in texts], [r for _, r in texts], stop,
                                                   data.max_len)
    return examples, tgt, dropped


class FinetuneTask(Task):
    """Fine-tunes of a pretrained GPT-family model on instruction pairs ("finetune": LoRA or full),
    and PEFT adapter directories. A loaded run is a GPT (adapters merged, or beside a quantized base):
    its LoadedModel's task is the GPT family's, which says what it can do (quantize, export, serve).

    Args:
        family: the registry's GPT task (it reads the bases: GGUF files, HF directories, GPT runs).
    """

    model_type, model_class, model_config, data_config = "finetune", GPT, FinetuneConfig, InstructionDataConfig
    kind, description = Kind.CAUSAL_LM, "a fine-tuned decoder-only language model (LoRA or full)"
    quantizable, servable, reads_adapters = True, True, True  # (exports: the loaded model's GPT family)
    evaluate_options = ("beam",)

    def __init__(self, family: Task):
        self.family = family

    def load_tokenizer(self, path: Path) -> ByteLevelBPE:
        return ByteLevelBPE.load(path / "tokenizer.json")

    def base(self, cfg: FinetuneConfig) -> LoadedModel:
        """The run's base model, checked: a LLaMA-family GPT (PEFT's names) without experts, with a
        chat template.

        Raises:
            UserError, FileNotFoundError: naming what is wrong or missing.
        """
        base = load_base(cfg.base, cfg.base_dtype, self.family)
        if base.chat_template is None:
            raise UserError(f"base={cfg.base}: the model has no chat template (instruction pairs are rendered with "
                             f"the model's own template); fine-tune an instruction model such as smollm2-135m")
        if base.model.cfg.n_experts:
            raise UserError(f"base={cfg.base}: LoRA fine-tuning of mixture-of-experts models is not implemented")
        hf_module_name(base.model, "layers.0.self_attn.q_proj")  # PEFT's names exist (LLaMA family), else UserError
        return base

    def prepare(self, spec: RunSpec) -> Prepared:
        cfg, data = spec.model_cfg, spec.data_cfg
        if not spec.resume:  # the base recorded as users would pass it, a path made absolute
            cfg = dataclasses.replace(cfg, base=base_name(cfg.base))
        base = self.base(cfg)
        stop = stop_tokens(base.tokenizer, base.model.cfg.eos_id)
        tokenizer = self.load_tokenizer(spec.out) if spec.resume else base.tokenizer
        args = (tokenizer, base.chat_template, base.special, data)
        train, _, dropped = _examples(*args, "train", base.model.cfg.eos_id, data.n_train)
        val, val_refs, _ = _examples(*args, "val", base.model.cfg.eos_id, data.eval_sentences)
        # FSDP2 cannot run a sharded layer twice in one step (the prefix, then the rows): its prefix is not shared.
        fsdp = distributed.current_world().distributed and spec.train_cfg.parallel == "fsdp"
        if fsdp and data.share_prefix:
            log.info("parallel=fsdp: each row computes its own prompt prefix (share_prefix needs a layer run twice)")
        objective = InstructionObjective(train, val, val_refs, tokenizer, data, spec.train_cfg.seed, 0, stop,
                                         share_prefix=data.share_prefix and not fsdp)

        def build(model_cfg: FinetuneConfig) -> GPT:
            model = base.model
            if model_cfg.lora_rank:
                apply_lora(model, model_cfg.targets, model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.lora_dropout,
                           model_cfg.use_rslora)
            else:
                model.requires_grad_(True)
            model.checkpoint_layers = model_cfg.activation_checkpointing
            log.info("fine-tuning %s (%s): %.2fM of %.2fM parameters trained", model_cfg.base, model_cfg.base_dtype,
                     trainable_parameters(model) / 1e6, model.num_parameters() / 1e6)
            return model

        def save_files(out: Path) -> None:
            tokenizer.save(out / "tokenizer.json")
            write_json_atomic(out / TOKENIZER_CONFIG, {"tokenizer_class": "PreTrainedTokenizerFast",
                                                        "chat_template": base.chat_template,
                                                        **{f"{k}_token": v for k, v in base.special.items()}})
            if cfg.lora_rank:
                write_json_atomic(out / ADAPTER_CONFIG, adapter_config(cfg.adapter_settings()))

        return Prepared(cfg, objective, save_files, run_info={"base_model": base.model.cfg.to_dict()},
                        build_model=build, save_best=save_adapter_weights if cfg.lora_rank else None,
                        summary=f"{len(train)} training pairs ({dropped} longer than max_len left out), "
                                f"{train.response_tokens()} response tokens per epoch")

    def load(self, path: str | Path) -> LoadedModel:
        """A fine-tune run: the base with its adapters (merged into fp32 / bf16 weights: the plain
        model; kept beside a quantized base, whose kernels then run) or, for a full fine-tune, its
        own weights.

        Raises:
            FileNotFoundError: naming what is missing. UserError: a damaged file, or a base that is
                not the one the run was trained on (another architecture or vocabulary).
        """
        path = Path(path)
        check_model_dir(path, ("config.json", WEIGHTS, "tokenizer.json"))
        saved, cfg, _, _ = self.read_config(path)
        base_cfg = GPTConfig.from_dict(saved.get("base_model") or {})
        if not cfg.lora_rank:
            model = GPT.for_loading(base_cfg)  # every weight comes from the run (load_weights checks)
            load_weights(model, path / WEIGHTS)
        else:
            model = load_base(cfg.base, cfg.base_dtype, self.family).model
            if model.cfg != base_cfg:
                raise UserError(f"{path}: its base {cfg.base} is no longer the model it was trained on "
                                f"(config {model.cfg} != {base_cfg})")
            _with_adapter(model, path)
        tokenizer = self.load_tokenizer(path)
        return LoadedModel(model.eval(), tokenizer, self.family, path, saved, read_chat_template(path),
                           special_strings(tokenizer, model.cfg))

    def load_hf(self, path: Path) -> LoadedModel:
        """A PEFT adapter directory (one peft wrote, or one of our LoRA runs' files elsewhere): the
        base its adapter_config.json names (base_model_name_or_path: a pretrained name or a path)
        with the adapters, as load() gives a run; the directory's own tokenizer.json and chat template
        where it has them.

        Raises:
            FileNotFoundError, UserError: naming what is missing or unsupported (no base named, an
                option attnlab does not implement, tensors that do not fit the base).
        """
        settings = read_adapter_config(path / ADAPTER_CONFIG)
        if not settings.base:
            raise UserError(f"{path / ADAPTER_CONFIG}: base_model_name_or_path is not set; attnlab loads an adapter "
                            f"on the model it names")
        base = load_base(settings.base, "fp32", self.family)
        _with_adapter(base.model, path)
        tokenizer = ByteLevelBPE.load(path / "tokenizer.json") if (path / "tokenizer.json").is_file() else base.tokenizer
        return LoadedModel(base.model.eval(), tokenizer, self.family, path, chat_template=read_chat_template(path)
                           or base.chat_template, special=special_strings(tokenizer, base.model.cfg))

    def evaluate_run(self, run: LoadedModel, split: str | None, limit: int | None, beam: int | None = None) -> dict:
        """sacreBLEU of the completions on a split ("test" = the data's test split, "val", "train"),
        greedy or with `beam` (default: the run's beam_size), against the raw references.

        Returns:
            {"split", "n", "bleu", "beam"}.
        """
        data = InstructionDataConfig.from_dict(run.config["data"])
        return translation_bleu(run.model, run.tokenizer, read_chat_template(run.path), data, split, limit, beam)


def _with_adapter(model: GPT, folder: Path) -> None:
    """Put the PEFT adapter in `folder` on `model` and merge it into float weights (a quantized base
    keeps it beside: its kernels run, nn/lora.py)."""
    load_adapter(model, folder)
    if not any(isinstance(m.base_layer, QuantLinear) for m in lora_layers(model).values()):
        merge_lora(model)

