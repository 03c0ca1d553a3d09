"""Paper 000, Appendix A, Figure 8: the one-shot chain-of-thought Pruning prompt (section 3.2.2)."""

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
Rationale: Let's think step by step. a step-by-step deduction that identifies the correct response
Answer: a short factoid answer, often between 1 and 5 words. Make sure generate "Answer:" for the final answer.
{UNKNOWN_INSTRUCTION} as answer.

Context:
{DEMO_CONTEXT}
Question: {DEMO_QUESTION}
Rationale: Let's think step by step. The question is asking for the 2009 movie that Peter Outerbridge was in as \
William Easton. We can use process of pruning to figure this out. Source 1 doesn't contain the information. In \
source 2, it talks about a made-for-TV movie in 2004. In source 3, it talks about the sixth installment in the "Saw" \
franchise. This must be the movie we are looking for.
Answer: {DEMO_ANSWER}

Context:
{{{{ passages }}}}
Question: {{{{ query }}}}
Rationale: Let's think step by step."""
"""Variables: `passages` (a `format_passages` block of the top-k passages), `query`. The demonstration's rationale
eliminates irrelevant sources one by one ("Elimination Reasoning Demo")."""
