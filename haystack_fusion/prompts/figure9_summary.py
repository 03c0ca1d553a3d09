"""Paper 000, Appendix A, Figure 9: the one-shot chain-of-thought Summary prompt (section 3.2.2)."""

from __future__ import annotations

from haystack_fusion.prompts.examples import (
    ANSWER_FORMAT_EXAMPLES,
    DEMO_ANSWER,
    DEMO_CONTEXT,
    DEMO_QUESTION,
    UNKNOWN_INSTRUCTION,
)

TEMPLATE = f"""Answer questions with short factoid answers.

{ANSWER_FORMAT_EXAMPLES}

Follow the following format.

Context: sources that may contain relevant content
Question: the question to be answered
Rationale: Let's think step by step. a step-by-step summary that identifies the correct response
Answer: a short factoid answer, often between 1 and 5 words. Make sure generate "Answer:" for the final answer.
{UNKNOWN_INSTRUCTION} as answer.

Context:
{DEMO_CONTEXT}
Question: {DEMO_QUESTION}
Rationale: Let's think step by step. The question requires information on the 2009 movie that Peter Outerbridge was \
in as William Easton. From the sources, we can narrow down our focus to Source 3 that mentions "Saw VI", a movie \
released in 2009, in which Peter Outerbridge starred. By summarizing these details, the movie from 2009 featuring \
Peter Outerbridge is Saw VI.
Answer: {DEMO_ANSWER}

Context:
{{{{ passages }}}}
Question: {{{{ query }}}}
Rationale: Let's think step by step."""
"""Variables: `passages` (a `format_passages` block of the top-k passages), `query`. The demonstration's rationale
summarizes the relevant sources before answering ("Summary Reasoning Demo")."""
