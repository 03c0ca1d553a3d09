"""
The standalone question of a follow-up: the last user message of a chat rewritten so that retrieval and the strategy
can read it without the chat (conversational query rewriting). None of the three papers has a chat, and a follow-up
such as "How many LLM calls does it make?" names its subject only in an earlier turn; one LLM call rewrites it first.
The prompt is completion-style with four demonstrations; the chat's turns come in as one pre-formatted string
variable `history`, so chat text is never evaluated as template syntax.
"""

from __future__ import annotations

from haystack_fusion.prompts.liu import FIGURE7
from haystack_fusion.prompts.templates import ANSWER_LINE_STOP, PromptTemplate

STANDALONE_QUESTION = PromptTemplate(
    "standalone_question",
    "this package: a follow-up in a chat rewritten as a standalone question (no paper has a chat)",
    """Rewrite the last question of a conversation as a standalone question that can be understood without \
the conversation. Keep its meaning, replace words such as "it", "he" or "there" by what they refer to, and write only \
the question.

Conversation:
User: What is a transistor?
Assistant: A semiconductor device that switches signals.
Last question: Who invented it?
Standalone question: Who invented the transistor?

Conversation:
User: Who wrote the play Hamlet?
Assistant: William Shakespeare
Last question: When was he born?
Standalone question: When was William Shakespeare born?

Conversation:
User: What is photosynthesis?
Assistant: The process by which plants turn light into chemical energy.
Last question: How many steps does it have?
Standalone question: How many steps does photosynthesis have?

Conversation:
User: What is the capital of Norway?
Assistant: Oslo
Last question: How many people live there?
Standalone question: How many people live in Oslo?

Conversation:
{{ history }}
Last question: {{ query }}
Standalone question:""",
    answer_pattern=FIGURE7.answer_pattern,
    stop=ANSWER_LINE_STOP,
)
"""Variables: `history` (the earlier turns, one "User: ..." or "Assistant: ..." line each), `query` (the last user
message). The standalone question is the first line of the completion that is not blank, stripped, read as Figure 7's
answer line is; an empty completion gives "" (the caller then keeps the question as asked)."""
