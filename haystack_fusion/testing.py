"""Test doubles for pipelines built on haystack-fusion, as `haystack.testing` is for Haystack: no model, no network."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from functools import cache
from typing import Any

import jinja2
from haystack import component, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.tools import ToolsType, flatten_tools_or_toolsets
from haystack.utils import deserialize_callable, serialize_callable
from jinja2 import nodes

from haystack_fusion.prompts import PROMPTS
from haystack_fusion.prompts.sure import CHOICE_LETTERS


@component
class ScriptedChatGenerator:
    """
    A ChatGenerator that replies to the last message's text from a script and records every call, failed ones too, in
    order (thread-safe): `prompts` (the last message's text), `messages`, `kwargs` (`generation_kwargs`); `calls`.

    ### Usage example
    ```python
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.testing import ScriptedChatGenerator

    llm = ScriptedChatGenerator(reply=lambda prompt: prompt.upper(), fail_on="boom")
    llm.run([ChatMessage.from_user("hi")])  # {"replies": [ChatMessage.from_assistant("HI")]}
    assert llm.prompts == ["hi"] and llm.kwargs == [None] and llm.calls == 1

    ScriptedChatGenerator(reply=["(a) Paris, (b) Lyon", "True"])  # one reply per call, in order
    ```

    :param reply: Every call's reply; a list, one per call (then `RuntimeError`); or a function of the prompt text.
    :param fail_on: Calls whose prompt contains this text (or for which this function returns True) raise
        `RuntimeError(error)`.
    :param generation_kwargs: Its own settings, as a real ChatGenerator's.
    :param latency: Seconds each call waits before replying.
    :param model: The model name it stands for (`llm.model_name`); None: the class name.
    :raises ValueError: For a negative latency.
    """

    def __init__(
        self,
        reply: str | Sequence[str] | Callable[[str], str] = "Paris",
        *,
        fail_on: str | Callable[[str], bool] | None = None,
        error: str = "backend exploded",
        generation_kwargs: dict[str, Any] | None = None,
        latency: float = 0.0,
        model: str | None = None,
    ) -> None:
        if latency < 0:
            raise ValueError(f"`latency` must be >= 0, got {latency}")
        self.reply, self.fail_on, self.error = reply, fail_on, error
        self.generation_kwargs, self.latency, self.model = generation_kwargs, latency, model
        self.prompts: list[str] = []
        self.messages: list[list[ChatMessage]] = []
        self.kwargs: list[dict[str, Any] | None] = []
        self._lock = threading.Lock()

    def to_dict(self) -> dict[str, Any]:
        """The settings; a function by its import path (SerializationError for a lambda)."""
        functions = {key: getattr(self, key) for key in ("reply", "fail_on")}
        functions = {key: {"callable": serialize_callable(f)} if callable(f) else f for key, f in functions.items()}
        settings = {"error": self.error, "generation_kwargs": self.generation_kwargs, "latency": self.latency}
        return default_to_dict(self, **functions, **settings, **({"model": self.model} if self.model else {}))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScriptedChatGenerator:
        parameters = data["init_parameters"]
        for key in ("reply", "fail_on"):
            if isinstance(parameters.get(key), dict):
                parameters[key] = deserialize_callable(parameters[key]["callable"])
        return default_from_dict(cls, data)

    @property
    def calls(self) -> int:
        return len(self.prompts)

    def _answer(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        prompt = messages[-1].text or ""
        with self._lock:
            index = len(self.prompts)
            self.prompts.append(prompt)
            self.messages.append(list(messages))
            self.kwargs.append(generation_kwargs)
        fail_on = self.fail_on
        if fail_on and (fail_on(prompt) if callable(fail_on) else fail_on in prompt):
            raise RuntimeError(self.error)
        if isinstance(self.reply, str):
            text = self.reply
        elif callable(self.reply):
            text = self.reply(prompt)
        elif index < len(self.reply):
            text = self.reply[index]
        else:
            raise RuntimeError(f"no scripted reply left for call {index + 1} (the script holds {len(self.reply)})")
        return {"replies": [ChatMessage.from_assistant(text)]}

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record the call, then reply or raise RuntimeError (`fail_on` matched, or the script is used up)."""
        time.sleep(self.latency)
        return self._answer(messages, generation_kwargs)


@component
class AsyncScriptedChatGenerator(ScriptedChatGenerator):
    """
    A `ScriptedChatGenerator` with a `run_async` (waiting with `asyncio.sleep`, so concurrent calls overlap).

    ### Usage example
    ```python
    from haystack_fusion import PostFusionVoter
    from haystack_fusion.testing import AsyncScriptedChatGenerator

    voter = PostFusionVoter(chat_generator=AsyncScriptedChatGenerator(reply="Paris", latency=0.2))
    ```
    """

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        await asyncio.sleep(self.latency)
        return self._answer(messages, generation_kwargs)


@cache
def _fixed_text(template_text: str) -> tuple[str, ...]:
    """The literal parts of a template outside any block, stripped, in order."""
    parsed = jinja2.Environment().parse(template_text)
    outputs = (node.nodes for node in parsed.body if isinstance(node, nodes.Output))
    parts = (child.data.strip() for children in outputs for child in children if isinstance(child, nodes.TemplateData))
    return tuple(part for part in parts if part)


def identify_prompt(text: str) -> str | None:
    """The name of the `PROMPTS` template a prompt was rendered from, or None: of those whose fixed text it holds, the
    one with the most."""
    best, best_size = None, -1
    for name, template in PROMPTS.items():
        parts, position = _fixed_text(template.text), 0
        for part in parts:
            position = text.find(part, position)
            if position < 0:
                break
            position += len(part)
        size = sum(len(part) for part in parts)
        if position >= 0 and size > best_size:
            best, best_size = name, size
    return best


_ANSWER_FORMS = {  # the reply forms that only fill in the answer, by template name
    **dict.fromkeys(("pruning", "summary"), "Source 1 names {answer}, which answers the question.\nAnswer: {answer}"),
    **dict.fromkeys(("sure_base", "sure_mcq", "sure_sum_and_pred", "sure_sum_all"), "{answer}"),
    "con_single_call": "Passage #1 mentions {answer} in passing. Passage #2 states that the answer is {answer}. "
    "Based on the information given in above passages, the answer is {answer}.",
    "con_synthesis": " {answer}.",
}


@dataclass
class PromptReplies:
    """
    A reply function that answers each prompt of `PROMPTS` in the form its parser reads, with the answer `choose`
    returns or one of `answers` drawn by a hash of the prompt (the same prompt, the same reply). A concatenation
    prompt (Figure 7 over several passages) says "unknown" for a share `concatenation_unknown` of the questions and
    raises `RuntimeError` for a share `concatenation_fails`; SuRe's validity says "True" for a share `validity_true`,
    its ranking "Passage 1" for a share `prefer_first`.

    :param choose: The answer to a prompt, a function of its text; None: one of `answers`, drawn.
    :raises ValueError: For no answers, or a share outside [0, 1].
    """

    answers: Sequence[str] = ("Paris", "Lyon", "Marseille")
    _: KW_ONLY
    concatenation_unknown: float = 0.5
    concatenation_fails: float = 0.0
    validity_true: float = 0.7
    prefer_first: float = 0.5
    choose: Callable[[str], str] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.answers:
            raise ValueError("`answers` must hold at least one answer")
        for name in ("concatenation_unknown", "concatenation_fails", "validity_true", "prefer_first"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"`{name}` must be in [0, 1], got {getattr(self, name)}")
        self.answers = list(self.answers)

    def _draw(self, text: str, salt: str) -> float:
        digest = hashlib.sha256(f"{self.seed}:{salt}:{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def __call__(self, prompt: str | Mapping[str, Any]) -> str:
        """The reply to a prompt text or a chat-completions request body; RuntimeError for `concatenation_fails`."""
        if not isinstance(prompt, str):
            content = (prompt.get("messages") or [{}])[-1].get("content") or ""
            if isinstance(content, list):  # content parts
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            prompt = str(content)
        text = prompt.strip()
        name = identify_prompt(text)
        answer = self.choose(text) if self.choose else self.answers[int(self._draw(text, "answer") * len(self.answers))]
        if name is None:
            return answer
        if name in ("figure7", "distiller"):
            if text.count('</passage key="') > 1:  # concatenation: Figure 7 over all passages
                question = text.rsplit("Question:", 1)[-1]
                if self._draw(question, "fails") < self.concatenation_fails:
                    raise RuntimeError("PromptReplies fails this concatenation prompt (`concatenation_fails`)")
                if self._draw(question, "unknown") < self.concatenation_unknown:
                    return "unknown"
            return answer
        if name in ("sure_candidates", "sure_few_shot_candidates"):
            form = re.search(r"in the form: (.*?), and should not exceed", text)
            k = max(1, len(re.findall(r"\([a-z]\)", form.group(1)))) if form else 2
            n = len(self.answers)
            first = self.answers.index(answer) if answer in self.answers else 0
            picks = [self.answers[(first + i) % n] + ("" if i < n else f" {i + 1}") for i in range(k)]
            return ", ".join(f"({CHOICE_LETTERS[i % 26]}) {pick}" for i, pick in enumerate(picks))
        if name in ("sure_summary", "sure_few_shot_summary", "sure_generic_summary"):
            prediction = re.search(r"\nPrediction: \([a-z]\) ([^\n]*)\n", text)
            said = prediction.group(1) if prediction else answer
            return f"The passages say that the answer to the question is {said}, as the second passage states. [DONE]"
        if name == "sure_validity":
            return "True" if self._draw(text, "validity") < self.validity_true else "False"
        if name == "sure_ranking":
            return "Passage 1" if self._draw(text, "ranking") < self.prefer_first else "Passage 2"
        if name == "con_document_note":
            if answer == "unknown":
                return "The passage says nothing about the question.\nRelevance: (c) irrelevant"
            label = ("(a) answers directly", "(b) useful context", "(c) irrelevant")[int(self._draw(text, "note") * 3)]
            return f"The passage says the answer is {answer}.\nRelevance: {label}"
        if name == "standalone_question":  # the question as asked: it already stands alone
            asked = re.findall(r"\nLast question: ([^\n]*)\nStandalone question:", text)
            return f" {asked[-1]}" if asked else ""
        return _ANSWER_FORMS[name].format(answer=answer)


@component
class PromptAwareChatGenerator(ScriptedChatGenerator):
    """
    A `ScriptedChatGenerator` that answers each of our prompts in the form its parser reads (`PromptReplies`).

    ### Usage example
    ```python
    from haystack_fusion.strategies import build_pipeline, run_strategy
    from haystack_fusion.testing import PromptAwareChatGenerator, PromptReplies

    llm = PromptAwareChatGenerator(PromptReplies(["Paris", "Lyon"], concatenation_unknown=1.0))
    pipeline = build_pipeline("cascade", retriever=retriever, chat_generator=llm)
    run_strategy(pipeline, "Which city is the capital of France?")
    print(llm.calls, llm.prompts[0])
    ```

    :param settings: `ScriptedChatGenerator`'s other settings.
    """

    def __init__(self, replies: PromptReplies | None = None, **settings: Any) -> None:
        ScriptedChatGenerator.__init__(self, reply=replies or PromptReplies(), **settings)


def call_first_tool(messages: list[ChatMessage], tools: ToolsType | None = None) -> ChatMessage:
    """An Agent's turn for `MockChatGenerator(response_fn=call_first_tool)`: a call of the first tool with `{"query":
    <the last user message>}`, then "Based on the tool: <the last tool result>"."""
    results = [result for message in messages for result in message.tool_call_results]
    if results:
        return ChatMessage.from_assistant(f"Based on the tool: {results[-1].result}")
    available = flatten_tools_or_toolsets(tools)
    if not available:
        return ChatMessage.from_assistant("No tool to call.")
    query = next((m.text for m in reversed(messages) if m.role == ChatRole.USER and m.text), "")
    return ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name=available[0].name, arguments={"query": query})])
