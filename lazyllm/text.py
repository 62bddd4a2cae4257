"""Prompt encoding (raw text, a chat turn or chat messages), stopping rules (EOS ids, stop strings) and
incremental text for streaming."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_INTERNAL = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(torch.__file__)))


def caller_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel that names the first caller outside lazyllm and torch (for a
    warning raised under ``torch.inference_mode``, a fixed level would name torch's decorator)."""
    frame = sys._getframe(1)  # the function that will call warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame = frame.f_back
        level += 1
    return level


ROLES = ("system", "user", "assistant")

Messages = Sequence[Mapping[str, Any]]
"""Chat messages as OpenAI and transformers spell them: ``[{"role": "user", "content": "..."}, ...]``."""

Prompt = str | torch.Tensor | Sequence[int] | Messages
"""What the engine generates from: text, token ids ``[N]`` / ``[1, N]``, or chat messages."""


def is_messages(prompt: object) -> bool:
    """Whether ``prompt`` is a list of chat messages (a non-empty sequence of mappings)."""
    return (
        isinstance(prompt, list | tuple) and len(prompt) > 0 and all(isinstance(m, Mapping) for m in prompt)
    )


def check_messages(messages: Messages) -> list[dict[str, str]]:
    """``messages`` as plain ``{"role", "content"}`` dicts, checked; an error names the message and field.

    ``content`` is a string, or OpenAI's list of text parts (``[{"type": "text", "text": "..."}]``),
    which are joined. Roles: system, user, assistant.
    """
    if not is_messages(messages):
        raise ValueError('messages must be a non-empty list of {"role": ..., "content": ...} objects')
    out = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role = {role!r}: must be one of {', '.join(ROLES)}")
        if isinstance(content, list) and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string (or a list of text parts)")
        out.append({"role": role, "content": content})
    return out


def encode_prompt(tokenizer: Any, prompt: Prompt, *, chat: bool | None = None) -> torch.Tensor:
    """Token ids ``[1, N]`` of a prompt given as text, ids or chat messages.

    Chat messages are rendered by the tokenizer's chat template with the generation prompt appended
    (whatever ``chat`` says). A text prompt becomes the user turn of the template when ``chat`` is
    true (a tokenizer without a template is then an error) or ``None``, the default everywhere (the
    Python API, ``python -m lazyllm.generate``, a served schedule), when the tokenizer has a template:
    an instruct model is used as it was trained, a base model (no template) gets the raw text.
    ``chat=False`` always gives the raw text. Token ids are used as they are.
    """
    if is_messages(prompt):
        return _apply_template(tokenizer, check_messages(prompt))  # type: ignore[arg-type]
    if not isinstance(prompt, str):
        if chat:
            raise ValueError("chat=True needs a text prompt; token ids are used as they are")
        return torch.as_tensor(prompt, dtype=torch.long).reshape(1, -1)
    if tokenizer is None:
        raise ValueError("a text prompt needs a tokenizer: LazyLLM(model, schedule, tokenizer=tokenizer)")
    if chat is None:
        chat = has_chat_template(tokenizer)
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "chat=True but the tokenizer has no chat template; pass chat=False for a raw prompt"
            )
        return _apply_template(tokenizer, [{"role": "user", "content": prompt}])
    return torch.as_tensor(tokenizer(prompt)["input_ids"], dtype=torch.long).reshape(1, -1)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has a chat template (what ``chat=None`` applies to a text prompt)."""
    return bool(getattr(tokenizer, "chat_template", None))


def _apply_template(tokenizer: Any, messages: list[dict[str, str]]) -> torch.Tensor:
    if tokenizer is None:
        raise ValueError("chat messages need a tokenizer: LazyLLM(model, schedule, tokenizer=tokenizer)")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template: pass a text prompt with chat=False instead of messages"
        )
    try:
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    except Exception as exc:  # jinja's TemplateError: the template refuses these messages
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"the tokenizer's chat template refused the messages: {message}") from None
    return torch.as_tensor(encoded["input_ids"], dtype=torch.long).reshape(1, -1)


@dataclass(frozen=True)
class StopCriteria:
    """When greedy decoding stops, and the text it returns.

    Args:
        eos_ids: token ids that end the generation.
        stop_strings: the generation ends once its decoded text contains one of these.
        tokenizer: decodes the generation (None: no text, and no stop strings allowed).
    """

    eos_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    tokenizer: Any

    def __post_init__(self) -> None:
        if self.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: LazyLLM(model, schedule, tokenizer=tokenizer)")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings contains an empty string; remove it")

    @classmethod
    def build(
        cls, model: Any, tokenizer: Any, eos_token_id: int | Sequence[int] | None, stop_strings: Sequence[str]
    ) -> StopCriteria:
        """EOS ids from the argument, else the model's generation config, else the tokenizer."""
        if eos_token_id is None:
            config = getattr(model, "generation_config", None)
            eos_token_id = getattr(config, "eos_token_id", None)
            if eos_token_id is None and tokenizer is not None:
                eos_token_id = tokenizer.eos_token_id
        ids = (
            []
            if eos_token_id is None
            else [eos_token_id]
            if isinstance(eos_token_id, int)
            else list(eos_token_id)
        )
        return cls(
            eos_ids=frozenset(int(i) for i in ids), stop_strings=tuple(stop_strings), tokenizer=tokenizer
        )

    @property
    def window(self) -> int:
        """Tokens whose text :meth:`check` decodes: enough to hold the longest stop string (a token
        gives at least one byte, a character at most four) with margin for the window's first token,
        whose text may decode differently without the tokens before it."""
        return 4 * max((len(s) for s in self.stop_strings), default=0) + 8

    def check(self, generated: list[int]) -> str | None:
        """ "eos" or "stop_string" if the generation should end now, else None.

        Called after each new token, so a stop string is found when it first appears, ending in the
        newest token's text: only the last :attr:`window` tokens are decoded (not the whole
        generation at every token)."""
        if generated and generated[-1] in self.eos_ids:
            return "eos"
        if self.stop_strings:
            tail = self.tokenizer.decode(generated[-self.window :], skip_special_tokens=True)
            if any(s in tail for s in self.stop_strings):
                return "stop_string"
        return None

    def text(self, generated: list[int]) -> str | None:
        """The decoded generation without special tokens, cut before the first stop string."""
        if self.tokenizer is None:
            return None
        text: str = self.tokenizer.decode(generated, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop_strings) if i >= 0), default=len(text))
        return text[:cut]
