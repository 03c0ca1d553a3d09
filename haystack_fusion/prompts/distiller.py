"""
Paper 000, section 3.3 and Figure 2 (bottom): the second round of Concatenation as the Distiller (PF+Concat).

The paper gives no figure for this prompt; it says the LLM "is prompted with the concatenation of the unfiltered
passages, along with the question and answer candidates generated from the first round". We keep Figure 7's
structure (task line, answer-format examples, unknown instruction, context, question) and add the candidates.
"""

from __future__ import annotations

from haystack_fusion.prompts.examples import ANSWER_FORMAT_EXAMPLES, UNKNOWN_INSTRUCTION

TEMPLATE = f"""Given the relevant background contexts and the candidate answers proposed from them, answer the current \
question using one of the context in short factoid phrase manner.
{ANSWER_FORMAT_EXAMPLES}
Pick the candidate answer that the contexts support best, or give a better extractive answer from the contexts. \
{UNKNOWN_INSTRUCTION}
Context: {{{{ passages }}}}
Question: {{{{ query }}}}
Candidate answers:{{% for candidate in candidates %}} ({{{{ "abcdefghijklmnopqrstuvwxyz"[loop.index0 % 26] }}}}) \
{{{{ candidate | replace("\\n", " ") | trim }}}}{{% endfor %}}
Answer:"""
"""Variables: `passages` (a `format_passages` block of the passages whose post-fusion answer was not unknown),
`query`, `candidates` (the post-fusion candidate pool, most votes first). Candidates are listed "(a) X (b) Y"."""
