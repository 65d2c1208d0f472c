"""The skeleton every task family shares, written once: train a recipe into a run directory, load a
run directory, evaluate it; and what a family states about itself (its kind and capabilities).

A family (tasks/translation.py, language_model.py, text_classification.py, vision.py) subclasses
Task and supplies only what differs: its model and config classes, its kind (tasks/kinds.py) and
capabilities, `prepare` (tokenizer, data and objective of a new or resumed run: the objective
satisfies train.objective.Objective), `load_tokenizer`, and `evaluate_run`; a family with a Hugging
Face form also `load_hf` / `export_hf`. The registry (tasks/registry.py) maps the run's
`model_type` to its Task; everything outside tasks/ asks the task, never the name.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import torch

from attnlab.config import Config
from attnlab.errors import UserError
from attnlab.models.base import Model
from attnlab.tasks.fit import check_world, fit
from attnlab.tasks.kinds import Kind
from attnlab.tasks.loaded import LoadedModel
from attnlab.train import distributed
from attnlab.train.checkpoint import load_weights
from attnlab.train.config import TrainConfig
from attnlab.train.guards import check_batch_memory
from attnlab.train.host_memory import heap_setup, release_free_memory
from attnlab.train.objective import Objective
from attnlab.train.run_dir import (check_model_dir, check_out_dir, check_resume_recipe, read_run_config, run_lock,
                                   start_run_dir)

log = logging.getLogger("attnlab")


@dataclass
class RunSpec:
    """The settings of a run being started or resumed, as `Task.prepare` receives them."""

    out: Path
    resume: bool
    recipe_name: str
    model_cfg: Config
    data_cfg: Config
    train_cfg: TrainConfig
    saved: dict | None    # the run's config.json when resuming


@dataclass
class Prepared:
    """What a family's `prepare` returns: everything the skeleton needs to build and train."""

    model_cfg: Config                      # final (vocab size and special ids from the tokenizer)
    objective: Objective                   # what the loop trains on (train/objective.py)
    save_files: Callable[[Path], None] = lambda out: None  # writes tokenizer.json etc. into a new run
    run_info: dict = field(default_factory=dict)  # extra config.json entries (labels, normalization)
    init_state: dict | None = None         # weights to start from (fine-tuning); heads may be missing
    summary: str = ""                      # one log line about the data
    save_best: Callable | None = None      # writes the best weights (None: checkpoint.save_weights)
    build_model: Callable | None = None    # model_cfg -> the model, in place of Task.build_model (a fine-tune:
                                           # the loaded base with its adapters); called after seeding


def upgrade_sections(saved: dict, data_config: type) -> dict:
    """config.json in the current layout: settings that older runs kept in "train" but that now
    belong to the task (batch_tokens, label_smoothing, eval_bleu_sentences, beam_size,
    length_penalty, init) move to "data" when the task's data config has them, else are dropped."""
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    data_fields = {f.name for f in dataclasses.fields(data_config)}
    train, data = dict(saved["train"]), dict(saved["data"])
    for key in [k for k in train if k not in train_fields]:
        value = train.pop(key)
        if key in data_fields:
            data.setdefault(key, value)
    return {**saved, "train": train, "data": data}


class Task:
    """One task family: builds, trains, loads and evaluates one kind of run (module docstring).

    What the family is and can do (a family may set these per instance, as LanguageModelTask does):
    """

    model_type: ClassVar[str]              # the registry key; config.json's "model_type"
    model_class: ClassVar[type]            # e.g. GPT
    model_config: ClassVar[type]           # e.g. GPTConfig
    data_config: ClassVar[type]            # e.g. TextDataConfig
    kind: ClassVar[Kind]                   # what the model does (tasks/kinds.py)
    description: ClassVar[str] = ""        # the family in words, with its article (default: its kind's)
    has_attention: ClassVar[bool] = True   # it has attention weights to draw (viz/); Mamba has none
    classifies: ClassVar[bool] = False     # classify() labels inputs (a classifier run)
    takes_images: ClassVar[bool] = False   # its inputs are image files, not texts
    quantizable: ClassVar[bool] = False    # runs with block-quantized weights (q8_0 / q4_0 / q4_1)
    gguf: ClassVar[bool] = False           # reads and writes GGUF files (interop/gguf.py, gguf_write.py)
    servable: ClassVar[bool] = False       # `attnlab serve` can run it
    hf_model_types: ClassVar[tuple[str, ...]] = ()  # "model_type"s of the HF model directories load_hf reads
    exports_hf: ClassVar[bool] = False     # export_hf writes a HF model directory
    reads_adapters: ClassVar[bool] = False  # load_hf reads PEFT adapter directories (the fine-tune family)
    rate_key: ClassVar[str] = "tokens_per_s"  # the training rate's name in the final record
    run_files: ClassVar[tuple[str, ...]] = ("config.json", "model.safetensors", "tokenizer.json")
    evaluate_options: ClassVar[tuple[str, ...]] = ()  # keyword options evaluate_run takes (e.g. beam)

    @property
    def described(self) -> str:
        """The family in words: "a decoder-only language model", "a Mamba (state-space) model"."""
        return self.description or self.kind.described

    # ------------------------------------------------------------------ what a family supplies
    def prepare(self, spec: RunSpec) -> Prepared:
        """Tokenizer, data and objective of a new run (spec.resume False: every setting is checked
        here, nothing is written) or of a resumed one (read from spec.out)."""
        raise NotImplementedError

    def load_tokenizer(self, path: Path):
        """The tokenizer saved in run directory `path` (None for tasks without text)."""
        raise NotImplementedError

    def evaluate_run(self, run: LoadedModel, split: str | None, limit: int | None, **options) -> dict:
        """The task's metrics of a loaded run on `split`: {"split", "n", ...}."""
        raise NotImplementedError

    def classify(self, run: LoadedModel, inputs: list[str]) -> list[tuple[str, float]]:
        """(label, probability) per input, for classifier families (`classifies`).

        Raises:
            UserError: for a family that is not a classifier.
        """
        raise UserError(f"{run.path} is {self.described}, not a classifier (the sst2 and mnist-vit recipes train "
                        f"classifiers)")

    def load_hf(self, path: Path) -> LoadedModel:
        """Load the Hugging Face model directory `path` (its config.json's model_type is one of
        `hf_model_types`), fp32.

        Raises:
            UserError: for a family with no Hugging Face form; FileNotFoundError, UserError naming
                what is missing or unsupported.
        """
        raise UserError(f"{path}: {self.described} has no Hugging Face form")

    def load_gguf(self, path: Path, dtype: str) -> LoadedModel:
        """Load the GGUF file `path` at `dtype` (families with `gguf`).

        Raises:
            UserError: for a family that does not read GGUF files, or a file it cannot hold.
        """
        raise UserError(f"{path}: {self.described} is not read from GGUF files")

    def export_hf(self, model: Model, tokenizer, out: Path, tokenizer_file: Path | None = None) -> None:
        """Write `model` (and its tokenizer) as a Hugging Face model directory at `out` (`exports_hf`).

        Raises:
            UserError: for a family with no Hugging Face export.
        """
        raise UserError(f"{self.described} has no Hugging Face export")

    def batch_memory(self, model_cfg: Config, data_cfg: Config) -> tuple[str, int, int] | None:
        """(the data setting that sizes a micro-batch, the tokens — or patches — in one, a lower bound
        on their activation bytes: guards.activation_bytes), checked before anything is allocated;
        None to skip the check."""
        return None

    def build_model(self, cfg: Config) -> Model:
        return self.model_class(cfg)

    # ------------------------------------------------------------------ the skeleton
    def read_config(self, path: Path) -> tuple[dict, Config, Config, dict]:
        """(config.json in the current layout, model config, data config, the "train" dict) of a run.

        Raises:
            ValueError: naming the file and what is wrong (another model type, a missing section,
                an invalid setting).
        """
        saved = upgrade_sections(read_run_config(path, self.model_type), self.data_config)
        try:
            return (saved, self.model_config.from_dict(saved["model"]), self.data_config.from_dict(saved["data"]),
                    saved["train"])
        except (TypeError, ValueError) as e:
            raise UserError(f"{path / 'config.json'}: {e}") from None

    def _settings(self, out: Path, recipe, resume: bool) -> RunSpec:
        """A resumed run takes its own saved settings (after checking its recipe), with the budgets
        (totals) of recipe.train; a new run takes the recipe's. Refuses a batch that cannot fit in
        memory (batch_memory) before anything is allocated. Sets torch's threads when named, and
        glibc's mmap threshold before any model is loaded (train/host_memory.py)."""
        check_out_dir(out, resume)
        if resume:
            saved, model_cfg, data_cfg, saved_train = self.read_config(out)
            check_resume_recipe(saved, recipe.name, out)
            try:
                train_cfg = TrainConfig.from_dict({**saved_train, "max_steps": recipe.train.max_steps,
                                                   "minutes": recipe.train.minutes})
            except (TypeError, ValueError) as e:
                raise UserError(f"{out / 'config.json'}: {e}") from None
        else:
            saved, model_cfg, data_cfg, train_cfg = None, recipe.model, recipe.data, recipe.train
        sized = self.batch_memory(model_cfg, data_cfg)
        if sized is not None:
            field_name, tokens, need = sized
            check_batch_memory(field_name, getattr(data_cfg, field_name), tokens, need)
        if train_cfg.threads:
            torch.set_num_threads(train_cfg.threads)
        heap_setup(train_cfg.malloc_mmap_threshold, getattr(model_cfg, "activation_checkpointing", False))
        return RunSpec(out, resume, recipe.name, model_cfg, data_cfg, train_cfg, saved)

    def train(self, recipe, out: str | Path, resume: bool = False) -> dict:
        """Train `recipe` (recipes.Recipe) into run directory `out`, or continue it (`resume`).

        A new run checks every setting (prepare builds the tokenizer, data and objective; then the
        model is built) before it writes config.json and the tokenizer; a resumed run continues from
        out/checkpoint/ with its saved settings, and recipe.train's budgets apply as totals. The run
        directory is written under its lock (run_dir.run_lock): one writer at a time. Under torchrun
        (train/distributed.py) every process runs this; rank 0 alone holds the lock and writes.

        Returns:
            the final validation record with "best", "best_step", "parameters", "steps" and the
            training rate under `rate_key`.
        Raises:
            FileExistsError / FileNotFoundError: for an `out` that cannot be used (run_dir.check_out_dir),
                DatasetNotFoundError: for missing data. ValueError: for an invalid setting.
            run_dir.RunDirInUse: when another process is training into `out`.
            files.DiskFullError, FloatingPointError (training diverged), guards.TrainingInterrupted.
        """
        out = Path(out)
        spec = self._settings(out, recipe, resume)
        prepared = self.prepare(spec)
        torch.manual_seed(spec.train_cfg.seed)
        model = (prepared.build_model or self.build_model)(prepared.model_cfg)
        if prepared.init_state is not None and not resume:
            model.load_state_dict({**model.state_dict(), **prepared.init_state})
        release_free_memory()  # what loading and preparing freed goes back before the steps (train/host_memory.py)
        check_world(prepared.objective, model, spec.train_cfg.parallel)
        distributed.barrier()  # several processes: every one has checked `out` before rank 0 writes it
        main = distributed.current_world().is_main
        with run_lock(out) if main else contextlib.nullcontext():
            if main:
                check_out_dir(out, resume)  # again: another process may have started a run here meanwhile
            if main and not resume:  # every setting has been checked: now the run directory is written
                start_run_dir(out, {"model_type": self.model_type, "recipe": recipe.name, **prepared.run_info,
                                    "model": prepared.model_cfg.to_dict(), "data": spec.data_cfg.to_dict(),
                                    "train": spec.train_cfg.to_dict()})
                prepared.save_files(out)
            log.info("model: %.2fM parameters%s", model.num_parameters() / 1e6,
                     f"; {prepared.summary}" if prepared.summary else "")
            return fit(model, prepared.objective, spec.train_cfg, out, resume, self.rate_key, prepared.save_best)

    def load(self, path: str | Path) -> LoadedModel:
        """Load a trained run directory (config.json, model.safetensors and the tokenizer).

        Raises:
            FileNotFoundError: naming the missing file. ValueError: for a damaged config, another
                model type, or weights that do not match.
        """
        path = Path(path)
        check_model_dir(path, self.run_files)
        saved, model_cfg, _, _ = self.read_config(path)
        model = self.build_model(model_cfg)
        load_weights(model, path / "model.safetensors")
        return LoadedModel(model.eval(), self.load_tokenizer(path), self, path, saved)

    def evaluate(self, path: str | Path, split: str | None = None, limit: int | None = None, **options) -> dict:
        """Load the run at `path` and score it on `split` (the task's metrics, "seconds" added).

        Raises:
            ValueError: for an option this task does not take (e.g. a beam for a language model),
                an unknown split, or as load().
        """
        unknown = sorted(k for k, v in options.items() if v is not None and k not in self.evaluate_options)
        if unknown:
            raise UserError(f"{unknown[0]}={options[unknown[0]]!r} does not apply to a {self.model_type} model "
                            f"({path})", param=unknown[0])
        run = self.load(path)
        t0 = time.perf_counter()
        record = self.evaluate_run(run, split, limit, **{k: v for k, v in options.items() if v is not None})
        return {**record, "seconds": round(time.perf_counter() - t0, 1)}

