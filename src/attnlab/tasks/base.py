"""The skeleton every task family shares, written once: train a recipe into a run directory, load a
run directory, evaluate it.

A family (tasks/translation.py, language_model.py, text_classification.py, vision.py) subclasses
Task and supplies only what differs: its model and config classes, `prepare` (tokenizer, data and
objective of a new or resumed run), `load_tokenizer`, and `evaluate_run`. The registry
(tasks/registry.py) maps the run's `model_type` to its Task.

The objective object a family hands to the loop (train/loop.py) has `batches(epoch)`,
`loss(model, batch) -> (loss, n)`, `evaluate(model) -> dict` and `best_metric`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from attnlab.config import Config
from attnlab.models.base import Model
from attnlab.train import distributed
from attnlab.train.checkpoint import load_weights, save_weights
from attnlab.train.config import TrainConfig
from attnlab.train.guards import check_batch_memory
from attnlab.train.loop import Trainer, optimizer_factory
from attnlab.train.parallel import check_shardable, make_strategy
from attnlab.train.run_dir import (check_model_dir, check_out_dir, check_resume_recipe, read_run_config, run_lock,
                                   start_run_dir)

log = logging.getLogger("attnlab")


@dataclass
class Run:
    """A trained run directory, loaded."""

    model: Model          # in eval mode
    tokenizer: Any        # ByteLevelBPE, a tokenizers.Tokenizer (BERT WordPiece), or None (images)
    config: dict          # config.json, in the current layout (see Task.read_config)
    path: Path

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


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
    objective: Any                         # the loop's task (module docstring)
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
    """One task family: builds, trains, loads and evaluates one kind of run (module docstring)."""

    model_type: ClassVar[str]              # the registry key; config.json's "model_type"
    model_class: ClassVar[type]            # e.g. GPT
    model_config: ClassVar[type]           # e.g. GPTConfig
    data_config: ClassVar[type]            # e.g. TextDataConfig
    rate_key: ClassVar[str] = "tokens_per_s"  # the training rate's name in the final record
    run_files: ClassVar[tuple[str, ...]] = ("config.json", "model.safetensors", "tokenizer.json")
    evaluate_options: ClassVar[tuple[str, ...]] = ()  # keyword options evaluate_run takes (e.g. beam)

    # ------------------------------------------------------------------ what a family supplies
    def prepare(self, spec: RunSpec) -> Prepared:
        """Tokenizer, data and objective of a new run (spec.resume False: every setting is checked
        here, nothing is written) or of a resumed one (read from spec.out)."""
        raise NotImplementedError

    def load_tokenizer(self, path: Path):
        """The tokenizer saved in run directory `path` (None for tasks without text)."""
        raise NotImplementedError

    def evaluate_run(self, run: Run, split: str | None, limit: int | None, **options) -> dict:
        """The task's metrics of a loaded run on `split`: {"split", "n", ...}."""
        raise NotImplementedError

    def classify(self, run: Run, inputs: list[str]) -> list[tuple[str, float]]:
        """(label, probability) per input, for classifier families.

        Raises:
            ValueError: for a family that is not a classifier.
        """
        raise ValueError(f"{run.path} is a {self.model_type} model, not a classifier (the sst2 and mnist-vit "
                         f"recipes train classifiers)")

    def export_hf(self, model: Model, tokenizer, out: Path, tokenizer_file: Path | None = None) -> None:
        """Write `model` (and its tokenizer) as a Hugging Face model directory at `out`.

        Raises:
            ValueError: for a family with no Hugging Face export.
        """
        raise ValueError(f"a {self.model_type} model has no Hugging Face export")

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
            raise ValueError(f"{path / 'config.json'}: {e}") from None

    def _settings(self, out: Path, recipe, resume: bool) -> RunSpec:
        """A resumed run takes its own saved settings (after checking its recipe), with the budgets
        (totals) of recipe.train; a new run takes the recipe's. Refuses a batch that cannot fit in
        memory (batch_memory) before anything is allocated. Sets torch's threads when named."""
        check_out_dir(out, resume)
        if resume:
            saved, model_cfg, data_cfg, saved_train = self.read_config(out)
            check_resume_recipe(saved, recipe.name, out)
            try:
                train_cfg = TrainConfig.from_dict({**saved_train, "max_steps": recipe.train.max_steps,
                                                   "minutes": recipe.train.minutes})
            except (TypeError, ValueError) as e:
                raise ValueError(f"{out / 'config.json'}: {e}") from None
        else:
            saved, model_cfg, data_cfg, train_cfg = None, recipe.model, recipe.data, recipe.train
        sized = self.batch_memory(model_cfg, data_cfg)
        if sized is not None:
            field_name, tokens, need = sized
            check_batch_memory(field_name, getattr(data_cfg, field_name), tokens, need)
        if train_cfg.threads:
            torch.set_num_threads(train_cfg.threads)
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

    def load(self, path: str | Path) -> Run:
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
        return Run(model.eval(), self.load_tokenizer(path), saved, path)

    def evaluate(self, path: str | Path, split: str | None = None, limit: int | None = None, **options) -> dict:
        """Load the run at `path` and score it on `split` (the task's metrics, "seconds" added).

        Raises:
            ValueError: for an option this task does not take (e.g. a beam for a language model),
                an unknown split, or as load().
        """
        unknown = sorted(k for k, v in options.items() if v is not None and k not in self.evaluate_options)
        if unknown:
            raise ValueError(f"--{unknown[0]} does not apply to a {self.model_type} model ({path})")
        run = self.load(path)
        t0 = time.perf_counter()
        record = self.evaluate_run(run, split, limit, **{k: v for k, v in options.items() if v is not None})
        return {**record, "seconds": round(time.perf_counter() - t0, 1)}


def check_world(objective, model: Model, parallel: str) -> None:
    """Several processes: refuse more of them than the rows (sentences, sequences, images) of the
    first global batch, and a model that `parallel` "fsdp" cannot shard; before anything is written.

    Raises:
        ValueError: one line ("mismatched world size" naming both numbers; parallel.check_shardable).
    """
    world = distributed.current_world()
    if world.distributed:
        if parallel == "fsdp":
            check_shardable(model)
        first = objective.batch_rows(objective.batches(0)[0])
        if first < world.size:
            raise ValueError(f"mismatched world size: {world.size} processes cannot split a global batch of "
                             f"{first} rows (sentences, sequences or images); use at most {first} processes or a "
                             f"larger batch")


def fit(model: Model, objective, train_cfg: TrainConfig, out: Path, resume: bool,
        rate_key: str = "tokens_per_s", save_best: Callable | None = None) -> dict:
    """Train with the shared loop (resuming from out/checkpoint when asked) and return the final
    record with "parameters", "steps" and the training rate under `rate_key` (units the objective's
    loss counts: tokens, sentences or images per second). Under torchrun the model runs as
    train_cfg.parallel says (train/parallel.py).

    Raises:
        ValueError: for a model FSDP cannot shard (parallel.check_shardable).
    """
    strategy = None
    if distributed.current_world().distributed:
        strategy = make_strategy(model, objective, optimizer_factory(train_cfg), train_cfg.parallel)
    trainer = Trainer(model, objective, train_cfg, out, getattr(model.cfg, "d_model", 512), strategy,
                      save_best or save_weights)
    if resume:
        trainer.resume()
    record = trainer.fit()
    s = trainer.state
    return {**record, "parameters": model.num_parameters(), "steps": s["step"],
            rate_key: round(s["tokens"] / max(s["elapsed_s"], 1e-9), 1)}
