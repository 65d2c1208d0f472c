"""Chat with an instruction-tuned model: render the model's own Jinja chat template, generate the
assistant's turn, keep the conversation."""
from __future__ import annotations

import json
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnlab.errors import UserError
from attnlab.generate import generate
from attnlab.textstream import TextStream


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
    """The prompt text of a conversation, as Hugging Face's apply_chat_template renders it.

    Uses jinja2's sandbox with trim_blocks and lstrip_blocks, the loopcontrols extension, a `tojson`
    filter and the `raise_exception` / `strftime_now` globals, like transformers.

    Args:
        template: the model's chat template. messages: [{"role": "system"|"user"|"assistant",
            "content": str}, ...]. add_generation_prompt: end with the assistant turn's opening.
    Raises:
        ValueError: when the template raises (e.g. roles out of order) or does not parse.
    """
    def raise_exception(message):
        raise UserError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                 ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=bos_token, eos_token=eos_token)
    except jinja2.TemplateError as e:
        raise UserError(f"chat template does not render: {e}") from None


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<|endoftext|>")  # chat templates' turn ends


def stop_tokens(tokenizer, eos_id: int | None) -> list[int]:
    """The ids that end an assistant's turn: `eos_id` and every END_OF_TURN token the tokenizer has."""
    ids = [] if eos_id is None else [eos_id]
    for name in END_OF_TURN:
        try:
            ids.append(tokenizer.token_to_id(name))
        except KeyError:
            pass
    return sorted(set(ids))


def chat_stop_tokens(loaded) -> list[int]:
    """stop_tokens of a loaded causal LM (tasks.LoadedModel): its eos id and its tokenizer's
    end-of-turn control tokens (e.g. <|im_end|>); sorted."""
    return stop_tokens(loaded.tokenizer, loaded.model.cfg.eos_id)


def chat_prompt(loaded, messages: list[dict]) -> list[int]:
    """The token ids of a conversation's prompt, ending with the assistant turn's opening: the model's
    own template (render_chat) with its bos/eos strings, special tokens allowed.

    Raises:
        UserError: when the model has no chat template or the template refuses the messages.
    """
    if not loaded.chat_template:
        raise UserError(f"{loaded.path} has no chat template; use plain-text completion instead")
    prompt = render_chat(loaded.chat_template, messages, True, loaded.special.get("bos", ""),
                         loaded.special.get("eos", ""))
    return loaded.tokenizer.encode(prompt, allowed_special="all")


class Chat:
    """A multi-turn conversation with a causal LM (a tasks.LoadedModel with a chat template).

    Args:
        loaded: the model. system: an optional system message. generation: keyword arguments of
            generate.generate (max_new_tokens, temperature, top_k, top_p, seed).
    Raises:
        ValueError: when the model has no chat template.
    """

    def __init__(self, loaded, system: str | None = None, **generation):
        if not loaded.chat_template:
            raise UserError(f"{loaded.path} has no chat template; use `attnlab generate` for plain text")
        self.loaded, self.system, self.generation = loaded, system, generation
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def stop_tokens(self) -> list[int]:
        """The ids that end the assistant's turn (chat_stop_tokens)."""
        return chat_stop_tokens(self.loaded)

    def send(self, text: str, on_text=None) -> str:
        """Add a user turn, generate the assistant's reply (calling on_text(piece) as it streams), keep
        both in the conversation and return the reply."""
        if not text.strip():
            raise UserError("empty message")
        self.messages.append({"role": "user", "content": text})
        ids = chat_prompt(self.loaded, self.messages)
        stream = TextStream(self.loaded.tokenizer, on_text or (lambda piece: None))
        try:
            new = generate(self.loaded.model, [ids], stop_tokens=self.stop_tokens(),
                           on_token=lambda row, token: stream.add(token), **self.generation)[0]
        except ValueError:
            self.messages.pop()
            raise
        reply = self.loaded.tokenizer.decode(new)
        stream.finish()
        self.messages.append({"role": "assistant", "content": reply})
        return reply
