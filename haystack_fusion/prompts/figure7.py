"""Liu et al., Appendix A, Figure 7: the zero-shot prompt of Concatenation (Eq. 1) and Post-Fusion (Eq. 2)."""

from __future__ import annotations

from haystack_fusion.prompts.examples import ANSWER_FORMAT_EXAMPLES, UNKNOWN_INSTRUCTION

TEMPLATE = f"""Given the relevant background contexts, answer the current question using one of the context in short \
factoid phrase manner.
{ANSWER_FORMAT_EXAMPLES}
Try your best to guess an extractive answer. {UNKNOWN_INSTRUCTION}
Context: {{{{ passages }}}}
Question: {{{{ query }}}}
Answer:"""
"""Concatenation fills `passages` with all top-k passages (section 3.2.1, Eq. 1); Post-Fusion with one passage at a
time (Eq. 2). Variables: `passages` (a `format_passages` block), `query`."""

ANSWER_PATTERN = r"^\s*(\S*(?:[^\S\n]+\S+)*)"
"""The answer is the first line of the completion after "Answer:" (after leading whitespace, newlines included),
without its trailing whitespace. Linear time: each whitespace run is read once, so a long run of spaces inside the
line costs no backtracking."""
