"""
Test doubles for pipelines built on haystack-fusion, as `haystack.testing` is for Haystack: no model, no network.

- `ScriptedChatGenerator` (and `AsyncScriptedChatGenerator`, with `run_async`): replies from a script (a text, a
  list of texts, or a function of the prompt), fails on chosen prompts, records every call and its kwargs.
- `PromptAwareChatGenerator`: answers each of our prompts in the form its parser reads (`PromptReplies`, keyed on the
  prompt registry `haystack_fusion.prompts.PROMPTS`), so every strategy runs end to end; `identify_prompt` tells which
  registered template a prompt was rendered from.

The test suite's own helpers (a local OpenAI-compatible server with fault injection, a `serve` child process,
hypothesis strategies of hostile replies) are in the repository's `tests/support/`, not shipped.

### Usage example
```python
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import PromptAwareChatGenerator, ScriptedChatGenerator

llm = ScriptedChatGenerator(reply="Paris", fail_on="boom")
pipeline = build_pipeline("post_fusion", retriever=retriever, chat_generator=llm)
assert run_strategy(pipeline, "Capital of France?").answer.data == "Paris"
assert llm.calls == 5  # one call per passage of the top 5
```
"""

from haystack_fusion.testing.prompt_replies import (
    REPLY_FORMS,
    PromptAwareChatGenerator,
    PromptReplies,
    identify_prompt,
    request_text,
)
from haystack_fusion.testing.scripted import AsyncScriptedChatGenerator, ScriptedChatGenerator

__all__ = [
    "REPLY_FORMS",
    "AsyncScriptedChatGenerator",
    "PromptAwareChatGenerator",
    "PromptReplies",
    "ScriptedChatGenerator",
    "identify_prompt",
    "request_text",
]
