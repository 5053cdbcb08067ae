"""The chat template: a list of messages -> the prompt text the instruct model was trained on.

The GGUF file carries the model's own template (`tokenizer.chat_template`, jinja2), and we render it the way HF
transformers does (a sandboxed environment with trim_blocks and lstrip_blocks), so the prompt matches what the model
saw in training. SmolLM2's template is ChatML: each message becomes `<|im_start|>role\\ncontent<|im_end|>\\n`, a
default system message is inserted when none is given, and `<|im_start|>assistant\\n` invites the reply.

The rendered text mixes two kinds of text: the template's own, which holds control tokens, and the messages'
contents, which are plain text whatever they contain. `render_segments` keeps them apart, so the tokenizer can encode
each kind by its own rule (Tokenizer.encode_chat).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InputError, ModelFileError

# Stands in for message n's content while the template renders. Private-use characters: no template writes them.
PLACEHOLDER = "\ue000content {}\ue001"
PLACEHOLDER_RE = re.compile("\ue000content (\\d+)\ue001")


class ChatTemplate:
    """A compiled jinja2 chat template with the bos/eos token texts it may use."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        def raise_exception(message):                     # templates call this to refuse a conversation
            raise InputError(f"chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ModelFileError(f"model file's chat template does not parse: {e}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """Messages [{"role", "content"}, ...] -> prompt text (containing control-token text)."""
        check_messages(messages)
        return self._render([dict(m) for m in messages], add_generation_prompt)

    def render_segments(self, messages: Sequence[Mapping[str, str]],
                        add_generation_prompt: bool = True) -> list[tuple[str, bool]] | None:
        """The rendered prompt cut into [(text, is_content)]: the template's own text and the messages' contents.

        Each content is rendered as a numbered placeholder, and the placeholders found in the result are replaced by
        the contents, so a content is known as one whatever text it holds. None when the pieces do not add up to
        `render(messages)`: the template rewrites contents (e.g. trims them) and no piece is a content verbatim.
        """
        check_messages(messages)
        marked = [{**m, "content": PLACEHOLDER.format(n) if m["content"] else ""} for n, m in enumerate(messages)]
        rendered = self._render(marked, add_generation_prompt)
        segments, start = [], 0
        for found in PLACEHOLDER_RE.finditer(rendered):
            n = int(found.group(1))
            if n >= len(messages):             # placeholder-like text that is no placeholder (e.g. in a role)
                return None
            segments += [(rendered[start : found.start()], False), (messages[n]["content"], True)]
            start = found.end()
        segments.append((rendered[start:], False))
        if "".join(text for text, _ in segments) != self.render(messages, add_generation_prompt):
            return None
        return [(text, is_content) for text, is_content in segments if text]

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except jinja2.TemplateError as e:
            raise InputError(f"chat template could not render these messages: {e}") from None


def check_messages(messages) -> None:
    """One clear line for the usual mistakes: not a list, no role, content not a string."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InputError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise InputError("messages is empty: give at least one {'role': 'user', 'content': ...}")
    for n, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InputError(f"messages[{n}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise InputError(f"messages[{n}] needs a non-empty string 'role' (system, user or assistant), "
                             f"got {role!r}")
        if not isinstance(content, str):
            raise InputError(f"messages[{n}] ({role}) needs a string 'content', got {type(content).__name__}")
