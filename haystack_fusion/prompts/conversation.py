"""The standalone question of a chat's follow-up (no paper has a chat), used by `serving.chat.standalone_question`."""

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
"""Variables: `history` (one "User: ..." or "Assistant: ..." line per turn, a string: never evaluated), `query`."""
