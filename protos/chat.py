"""ChatML in token space: the segments an agent conversation is built from.

The conversation is assembled from token-id segments, never by re-encoding decoded text, so the
ids the learner trains on are exactly the ids the generator sampled. A test checks that the
concatenated segments decode to what the tokenizer's own chat template renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"

# Jinja ChatML template saved with the tokenizer so HF and vLLM users render the same prompts.
# Plain messages render as bare ChatML (what `ChatFormat` builds in token space). With `tools`
# it follows Qwen2.5's hermes style, shortened for small contexts: the function signatures go
# into the system turn, an assistant's calls are written `<tool_call>{"name": ..., "arguments":
# ...}</tool_call>` after its text, and a tool result is a `tool` turn of its own.
CHATML_TEMPLATE = (
    "{%- set ns = namespace(skip=0) -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{ messages[0]['content'] + '\n\n' }}{%- set ns.skip = 1 -%}"
    "{%- endif -%}"
    "{{ '# Tools\nCall a function as <tool_call>{\"name\": <name>, \"arguments\": "
    "<object>}</tool_call>. Functions:' }}"
    "{%- for tool in tools -%}"
    "{{ '\n' + (tool['function'] if tool['function'] is defined else tool) | tojson }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages[ns.skip:] -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{{ '<tool_call>{\"name\": ' + f['name'] | tojson + ', \"arguments\": ' }}"
    "{{- f['arguments'] if f['arguments'] is string else f['arguments'] | tojson -}}"
    "{{ '}</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

# The template tiny models were saved with before it rendered tools: the same text for plain
# messages, so such a model takes the new one (`load_tokenizer`) and serves tools too.
PLAIN_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def load_tokenizer(path: str | Any) -> Any:
    """The tokenizer exactly as its tokenizer.json defines it.

    transformers 5's AutoTokenizer rebuilds the pre-tokenizer of known model types (Qwen2
    among them) from the model type and ignores the one saved in tokenizer.json. For real Qwen
    checkpoints the two agree; for the tiny model, whose tokenizer splits only at punctuation,
    they would not, and the ids would differ from pre-training. Loading tokenizer.json as-is
    is right for both.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tokenizer.chat_template == PLAIN_CHATML_TEMPLATE:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """Encodes the template pieces of a multi-turn ChatML conversation to token ids."""

    tokenizer: Any

    @property
    def im_end_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(IM_END)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(PAD)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str, observation: str) -> list[int]:
        """System message, first observation as the user turn, then the assistant header."""
        return self.encode(
            f"{IM_START}system\n{system}{IM_END}\n"
            f"{IM_START}user\n{observation}{IM_END}\n{IM_START}assistant\n"
        )

    def observation_ids(self, observation: str) -> list[int]:
        """What follows a finished assistant turn (which ends in <|im_end|>): the next user turn."""
        return self.encode(f"\n{IM_START}user\n{observation}{IM_END}\n{IM_START}assistant\n")

    def assistant_ids(self, text: str) -> list[int]:
        """An assistant turn as the canonical tokenisation of `text` plus <|im_end|>.

        Used only for pre-training transcripts; RL keeps the sampled ids instead.
        """
        return self.encode(text) + [self.im_end_id]
