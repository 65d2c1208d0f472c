"""The task registry is the one vocabulary of model kinds: every family states its kind and
capabilities, nothing outside tasks/ spells a kind or a family's name, the objectives satisfy the
loop's protocol, and the causal LMs satisfy what generate needs."""
import ast
import inspect
from pathlib import Path

import pytest
import torch

from attnlab.errors import UserError
from attnlab.models.base import CausalLM
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.mamba import Mamba, MambaConfig
from attnlab.tasks.base import Task
from attnlab.tasks.kinds import Kind
from attnlab.tasks.registry import TASKS, get_task, register, task_of_path
from attnlab.train.objective import Objective

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"
# where a family's own name is legitimately written: its model config declares it, its file format
# (interop/) writes the format's own "model_type" strings
OWNERS = ("tasks", "models", "interop")


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_kind_or_family_name_is_spelled_outside_tasks():
    words = {k.value for k in Kind} | set(TASKS)
    found = [f"{p.relative_to(SRC)}:{line}: {value!r}" for p in sorted(SRC.rglob("*.py"))
             if p.relative_to(SRC).parts[0] not in OWNERS for line, value in _strings(p) if value in words]
    assert found == []


def test_the_scan_would_see_a_kind_string(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(loaded):\n    return loaded.model_type == "gpt" or loaded.kind == "encoder"\n')
    assert {v for _, v in _strings(bad)} == {"gpt", "encoder"}


@pytest.mark.parametrize("model_type", sorted(TASKS))
def test_every_family_states_its_kind_and_capabilities(model_type):
    task = get_task(model_type)
    assert isinstance(task.kind, Kind) and task.model_config.model_type == model_type
    assert task.described.startswith(("a ", "an "))
    assert not (task.gguf or task.quantizable or task.servable) or task.kind in (Kind.CAUSAL_LM, Kind.ENCODER)
    assert task.exports_hf == bool(task.hf_model_types)  # every HF form here is read and written
    assert (type(task).classify is not Task.classify) == task.classifies  # a classifier has classify()


def test_what_the_families_can_do():
    gpt, mamba, bert, vit, seq2seq = (get_task(t) for t in ("gpt", "mamba", "bert", "vit", "seq2seq"))
    assert [t.kind for t in (gpt, mamba, bert, vit, seq2seq)] == [Kind.CAUSAL_LM, Kind.CAUSAL_LM, Kind.ENCODER,
                                                                  Kind.CLASSIFIER, Kind.SEQ2SEQ]
    assert gpt.quantizable and gpt.gguf and not mamba.quantizable and not mamba.gguf and not mamba.has_attention
    assert {"llama", "mistral", "qwen2", "mixtral", "gpt2"} <= set(gpt.hf_model_types)
    assert mamba.hf_model_types == ("mamba",) and bert.hf_model_types == ("bert",)
    assert bert.classifies and vit.classifies and vit.takes_images and not seq2seq.exports_hf


def test_a_second_reader_of_one_hf_model_type_is_refused():
    from attnlab.tasks.language_model import HFForm, LanguageModelTask

    class OtherConfig(GPTConfig):
        model_type = "other-gpt"

    with pytest.raises(UserError, match="HF model_type 'llama' is read by gpt already"):
        register(LanguageModelTask(GPT, OtherConfig, HFForm(("llama",), None, None)))
    assert "other-gpt" not in TASKS


def test_the_family_of_a_path_without_loading_it(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    assert task_of_path(tmp_path) is get_task("gpt")
    (tmp_path / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(UserError, match="model_type 't5' is not supported; supported: bert, gpt2, llama"):
        task_of_path(tmp_path)
    with pytest.raises(FileNotFoundError):
        task_of_path(tmp_path / "nothing")


def test_every_objective_satisfies_the_loops_protocol():
    from attnlab.tasks.language_model import LanguageModelObjective
    from attnlab.tasks.masked_lm import MaskedLMObjective
    from attnlab.tasks.sentence_classification import SentenceClassificationObjective
    from attnlab.tasks.translation import TranslationObjective
    from attnlab.tasks.vision import ImageClassificationObjective
    members = [name for name in dir(Objective) if not name.startswith("_")] + list(Objective.__annotations__)
    for cls in (LanguageModelObjective, MaskedLMObjective, SentenceClassificationObjective, TranslationObjective,
                ImageClassificationObjective):
        missing = [m for m in members if not hasattr(cls, m)]
        assert missing == [], cls.__name__
        assert isinstance(cls.higher_is_better, bool) and isinstance(cls.leaves_parameters_unused, bool)


@pytest.mark.parametrize("model", [
    GPT(GPTConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, max_seq_len=16)),
    Mamba(MambaConfig(vocab_size=16, d_model=8, n_layers=1)),
], ids=["gpt", "mamba"])
def test_gpt_and_mamba_are_causal_lms(model):
    assert isinstance(model, CausalLM)
    wanted = list(inspect.signature(CausalLM.forward).parameters)[1:]
    # the protocol's parameters first, in its order; a family may add options of its own after them
    # (GPT's return_hidden for a loss that applies the output projection itself)
    assert list(inspect.signature(model.forward).parameters)[:len(wanted)] == wanted
    for name in ("bos_id", "eos_id", "max_seq_len", "vocab_size"):
        assert hasattr(model.cfg, name)
    model.setup_kv_cache(1, 8)
    out = model(torch.tensor([[1, 2, 3]]), logits_to_keep=1)
    assert out.logits.shape == (1, 1, 16) and out.aux_loss.shape == () and model.kv_cache_bytes() > 0
    model.clear_kv_cache()
    assert model.kv_cache_bytes() == 0
