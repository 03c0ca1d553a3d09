"""
Replies to each of our prompts in the form its parser reads, keyed on the prompt registry (`prompts.PROMPTS`).

`identify_prompt` tells which registered template a prompt was rendered from, by the template's own fixed text (the
literal parts of its Jinja source that every rendering holds, in order), so it follows any change of wording.
`PromptReplies` answers each registered template by name; `PromptAwareChatGenerator` is a ChatGenerator that replies
with it, and the test server (`tests.support.openai_server`) takes it as its `reply`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import jinja2
from haystack import component
from jinja2 import nodes

from haystack_fusion.prompts import PROMPTS
from haystack_fusion.testing.scripted import ScriptedChatGenerator

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@cache
def _fixed_text(template_text: str) -> tuple[str, ...]:
    """The literal parts of a template that every rendering holds, in order (stripped; those outside any block)."""
    parsed = jinja2.Environment().parse(template_text)
    parts = [
        child.data.strip()
        for node in parsed.body
        if isinstance(node, nodes.Output)
        for child in node.nodes
        if isinstance(child, nodes.TemplateData)
    ]
    return tuple(part for part in parts if part)


def _holds_in_order(text: str, parts: Sequence[str]) -> bool:
    position = 0
    for part in parts:
        found = text.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return True


def identify_prompt(text: str) -> str | None:
    """
    The name of the registered template (`haystack_fusion.prompts.PROMPTS`) a prompt was rendered from.

    A template matches when the prompt holds all of its fixed text, in order; of several matching templates, the one
    with the most fixed text wins (a few-shot template holds its zero-shot twin's text and its demonstrations).

    ### Usage example
    ```python
    from haystack_fusion.prompts import PROMPTS, format_passages, render
    from haystack_fusion.testing import identify_prompt

    prompt = render(PROMPTS["figure7"], passages=format_passages([]), query="Who?")[0].text
    assert identify_prompt(prompt) == "figure7"
    ```

    :param text: The prompt text (a rendered template, or anything else).
    :returns: The template's name in `PROMPTS`, or None when no template matches.
    """
    best, best_size = None, -1
    for name, template in PROMPTS.items():
        parts = _fixed_text(template.text)
        size = sum(len(part) for part in parts)
        if size > best_size and _holds_in_order(text, parts):
            best, best_size = name, size
    return best


def request_text(body: Mapping[str, Any]) -> str:
    """
    The prompt of a chat-completions request: the last message's text (content parts joined), stripped.

    :param body: The request body (parsed JSON) of `POST /v1/chat/completions`.
    :returns: The text; "" for a request without messages.
    """
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content") or ""
    if isinstance(content, list):  # content parts
        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content).strip()


class PromptReplies:
    """
    A reply function that answers each prompt of `haystack_fusion.prompts.PROMPTS` in the form its parser reads.

    The prompt is recognised with `identify_prompt` and answered by template name (`REPLY_FORMS` says how); the answer
    is one of `answers`, chosen by a hash of the prompt (the same prompt always gets the same reply, and post-fusion's
    per-passage votes differ from passage to passage), or what `choose` returns for the prompt. Anything that is not one
    of our prompts gets the chosen answer.

    - Figure 7 (Liu et al., Appendix A) and the distiller: the answer on the first line. A prompt of more than one
      passage (concatenation) says "unknown" for a share `concatenation_unknown` of the questions, so `concat_pf` and
      `cascade` go on to post-fusion, and raises `RuntimeError` for a share `concatenation_fails` (the test server
      answers HTTP 500 to every request of that prompt, retries included: the call fails after its retries).
    - Figures 8 and 9 (chain of thought): a rationale, then "Answer: <answer>".
    - SuRe (Kim et al.): Listings 6 and 13 "(a) <answer 1>, (b) <answer 2>" with as many candidates as the prompt
      asks for; Listings 7 and 11 a summary ending "[DONE]"; Listing 8 "True" (a share `validity_true`) or "False";
      Listing 9 "Passage 1" (a share `prefer_first`) or "Passage 2"; Listings 10, 12 and Table 3's prompts the answer.
    - Chain-of-Note (Yu et al.): the single call's reading notes ending "the answer is <answer>."; the per-document
      note with a "Relevance:" line ("(c) irrelevant" when the answer chosen is "unknown"); the synthesis's
      "<answer>." after "the answer is".

    ### Usage example
    ```python
    from haystack_fusion.testing import PromptAwareChatGenerator, PromptReplies

    replies = PromptReplies(["Paris", "Lyon"], concatenation_unknown=1.0)
    replies("Who?")  # "Paris" or "Lyon": not one of our prompts
    llm = PromptAwareChatGenerator(replies)  # a ChatGenerator for every strategy, no model
    ```

    :param answers: The answers to choose from (at least one).
    :param concatenation_unknown: Share (0-1) of concatenation prompts answered "unknown".
    :param concatenation_fails: Share (0-1) of concatenation prompts whose reply raises `RuntimeError`, drawn apart
        from `concatenation_unknown`.
    :param validity_true: Share (0-1) of SuRe's validity prompts (Listing 8) answered "True".
    :param prefer_first: Share (0-1) of SuRe's ranking prompts (Listing 9) answered "Passage 1".
    :param choose: The answer to a prompt, a function of its text; None (the default) draws one of `answers`.
    :param seed: Seeds the draws.
    :raises ValueError: For no answers, or a share outside [0, 1].
    """

    def __init__(
        self,
        answers: Sequence[str] = ("Paris", "Lyon", "Marseille"),
        *,
        concatenation_unknown: float = 0.5,
        concatenation_fails: float = 0.0,
        validity_true: float = 0.7,
        prefer_first: float = 0.5,
        choose: Callable[[str], str] | None = None,
        seed: int = 0,
    ) -> None:
        if not answers:
            raise ValueError("`answers` must hold at least one answer")
        shares = {
            "concatenation_unknown": concatenation_unknown,
            "concatenation_fails": concatenation_fails,
            "validity_true": validity_true,
            "prefer_first": prefer_first,
        }
        for name, share in shares.items():
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"`{name}` must be in [0, 1], got {share}")
        self.answers = list(answers)
        self.concatenation_unknown = concatenation_unknown
        self.concatenation_fails = concatenation_fails
        self.validity_true = validity_true
        self.prefer_first = prefer_first
        self.choose = choose
        self.seed = seed

    def _draw(self, text: str, salt: str = "") -> float:
        digest = hashlib.sha256(f"{self.seed}:{salt}:{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def _answer(self, text: str) -> str:
        if self.choose is not None:
            return self.choose(text)
        return self.answers[int(self._draw(text, "answer") * len(self.answers))]

    def __call__(self, prompt: str | Mapping[str, Any]) -> str:
        """
        The reply to a prompt.

        :param prompt: The prompt text, or a chat-completions request body (its last message is the prompt).
        :returns: The reply text.
        :raises RuntimeError: For a concatenation prompt drawn to fail (`concatenation_fails`).
        """
        text = prompt.strip() if isinstance(prompt, str) else request_text(prompt)
        name = identify_prompt(text)
        answer = self._answer(text)
        if name is None:
            return answer
        return REPLY_FORMS[name](self, text, answer)

    # The reply forms, one per kind of prompt; `REPLY_FORMS` maps every registered template to one of them.

    def _answer_line(self, text: str, answer: str) -> str:
        if text.count('</passage key="') > 1:  # concatenation: Figure 7 over all passages
            question = text.rsplit("Question:", 1)[-1]
            if self._draw(question, "fails") < self.concatenation_fails:
                raise RuntimeError("PromptReplies fails this concatenation prompt (`concatenation_fails`)")
            if self._draw(question, "unknown") < self.concatenation_unknown:
                return "unknown"
        return answer

    def _short_answer(self, text: str, answer: str) -> str:
        return answer

    def _chain_of_thought(self, text: str, answer: str) -> str:
        return f"Source 1 names {answer}, which answers the question.\nAnswer: {answer}"

    def _candidates(self, text: str, answer: str) -> str:
        form = re.search(r"in the form: (.*?), and should not exceed", text)
        k = max(1, len(re.findall(r"\([a-z]\)", form.group(1)))) if form else 2
        first = self.answers.index(answer) if answer in self.answers else 0
        picks = [self.answers[(first + i) % len(self.answers)] for i in range(k)]
        picks = [pick if i < len(self.answers) else f"{pick} {i + 1}" for i, pick in enumerate(picks)]
        return ", ".join(f"({LETTERS[i % 26]}) {pick}" for i, pick in enumerate(picks))

    def _summary(self, text: str, answer: str) -> str:
        prediction = re.search(r"\nPrediction: \([a-z]\) ([^\n]*)\n", text)
        said = prediction.group(1) if prediction else answer
        return f"The passages say that the answer to the question is {said}, as the second passage states. [DONE]"

    def _validity(self, text: str, answer: str) -> str:
        return "True" if self._draw(text, "validity") < self.validity_true else "False"

    def _ranking(self, text: str, answer: str) -> str:
        return "Passage 1" if self._draw(text, "ranking") < self.prefer_first else "Passage 2"

    def _reading_notes(self, text: str, answer: str) -> str:
        return (
            f"Passage #1 mentions {answer} in passing. Passage #2 states that the answer is {answer}. "
            f"Based on the information given in above passages, the answer is {answer}."
        )

    def _document_note(self, text: str, answer: str) -> str:
        if answer == "unknown":
            return "The passage says nothing about the question.\nRelevance: (c) irrelevant"
        label = ("(a) answers directly", "(b) useful context", "(c) irrelevant")[int(self._draw(text, "note") * 3)]
        return f"The passage says the answer is {answer}.\nRelevance: {label}"

    def _synthesis(self, text: str, answer: str) -> str:
        return f" {answer}."

    def _standalone_question(self, text: str, answer: str) -> str:
        asked = re.findall(r"\nLast question: ([^\n]*)\nStandalone question:", text)
        return f" {asked[-1]}" if asked else ""  # the question as asked: it already stands alone


REPLY_FORMS: dict[str, Callable[[PromptReplies, str, str], str]] = {
    "figure7": PromptReplies._answer_line,
    "pruning": PromptReplies._chain_of_thought,
    "summary": PromptReplies._chain_of_thought,
    "distiller": PromptReplies._answer_line,
    "sure_candidates": PromptReplies._candidates,
    "sure_few_shot_candidates": PromptReplies._candidates,
    "sure_summary": PromptReplies._summary,
    "sure_few_shot_summary": PromptReplies._summary,
    "sure_generic_summary": PromptReplies._summary,
    "sure_validity": PromptReplies._validity,
    "sure_ranking": PromptReplies._ranking,
    "sure_base": PromptReplies._short_answer,
    "sure_mcq": PromptReplies._short_answer,
    "sure_sum_and_pred": PromptReplies._short_answer,
    "sure_sum_all": PromptReplies._short_answer,
    "con_single_call": PromptReplies._reading_notes,
    "con_document_note": PromptReplies._document_note,
    "con_synthesis": PromptReplies._synthesis,
    "standalone_question": PromptReplies._standalone_question,
}
"""How `PromptReplies` answers each template of `PROMPTS`, by name: one entry per registered template (a unit test
checks that every one has an entry and that its parser reads the reply)."""


@component
class PromptAwareChatGenerator(ScriptedChatGenerator):
    """
    A ChatGenerator that answers each of our prompts in the form its parser reads (`PromptReplies`), no model needed.

    Every strategy runs end to end on it: the components' parsers read each reply as they read a model's. It records
    its calls as `ScriptedChatGenerator` does.

    ### Usage example
    ```python
    from haystack_fusion.strategies import build_pipeline, run_strategy
    from haystack_fusion.testing import PromptAwareChatGenerator, PromptReplies

    llm = PromptAwareChatGenerator(PromptReplies(["Paris", "Lyon"], concatenation_unknown=1.0))
    pipeline = build_pipeline("cascade", retriever=retriever, chat_generator=llm)
    run_strategy(pipeline, "Which city is the capital of France?")
    print(llm.calls, llm.prompts[0])
    ```
    """

    def __init__(self, replies: PromptReplies | None = None, **settings: Any) -> None:
        """
        Create the generator.

        :param replies: The reply function; None: `PromptReplies()` with its defaults.
        :param settings: `ScriptedChatGenerator`'s other settings (`fail_on`, `error`, `generation_kwargs`,
            `latency`).
        """
        ScriptedChatGenerator.__init__(self, reply=replies or PromptReplies(), **settings)
