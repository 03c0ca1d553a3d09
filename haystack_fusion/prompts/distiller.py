"""
Liu et al., section 3.3 and Figure 2 (bottom): the second round of Concatenation as the Distiller (PF+Concat).

The paper gives no figure for this prompt; it says the LLM "is prompted with the concatenation of the unfiltered
passages, along with the question and answer candidates generated from the first round". We keep Figure 7's
structure (task line, answer-format examples, unknown instruction, context, question) and add the candidates; the
format examples show a candidate line too (their wrong candidates are ours), so that a completion-style model answers
with one candidate instead of copying the list.
"""

from __future__ import annotations

from haystack_fusion.prompts.examples import UNKNOWN_INSTRUCTION

FORMAT_EXAMPLES = """Question: Who produced the album that included a re-recording of "Lithium"?
Candidate answers: (a) Kurt Cobain (b) Butch Vig
Answer: Butch Vig
Question: What city was the victim of Joseph Druces working in?
Candidate answers: (a) Boston, Massachusetts (b) Salem
Answer: Boston, Massachusetts
Question: In what year was the star of To Hell and Back born?
Candidate answers: (a) 1955 (b) 1925
Answer: 1925"""
"""Figure 7's three answer-format examples, each with a candidate line."""

DEMONSTRATION_ANSWERS: tuple[str, ...] = ("Butch Vig", "Boston, Massachusetts", "1925", "Kurt Cobain", "Salem", "1955")
"""Every answer and candidate of `FORMAT_EXAMPLES` (for the answer validator)."""

TEMPLATE = f"""Given the relevant background contexts and the candidate answers proposed from them, answer the current \
question using one of the context in short factoid phrase manner.
{FORMAT_EXAMPLES}
Pick the candidate answer that the contexts support best, or give a better extractive answer from the contexts. \
{UNKNOWN_INSTRUCTION}
Context: {{{{ passages }}}}
Question: {{{{ query }}}}
Candidate answers:{{% for candidate in candidates %}} ({{{{ "abcdefghijklmnopqrstuvwxyz"[loop.index0 % 26] }}}}) \
{{{{ candidate | replace("\\n", " ") | trim }}}}{{% endfor %}}
Answer:"""
"""Variables: `passages` (a `format_passages` block of the passages whose post-fusion answer was not unknown),
`query`, `candidates` (the post-fusion candidate pool, most votes first). Candidates are listed "(a) X (b) Y"."""

ANSWER_PATTERN = (
    r"^\s*(?:\([a-z]\)\s*)?("
    # the answer, read token by token up to the first place where a listed candidate or the line's end starts:
    r"(?:(?!\([a-z]\)\s)\S"  # a character that does not start a label "(b) "
    r"|[^\S\n]+(?!\([a-z]\)\s)(?=\S)"  # a whole run of spaces inside the line, not before a label
    # a trailing run of spaces up to its last character other than space or tab, unless the run goes on past the
    # line's end to a label
    r"|[^\S\n]*[^\S \t\n](?=[ \t]*(?:\n|$))(?![ \t]*\n\s*\([a-z]\)\s)"
    r")*)(?:\s*\([a-z]\)\s[^\n]*)?[ \t]*(?:\n|$)"
)
"""The first line of the completion, without a leading candidate label "(a) " and without further listed candidates
(" (b) ..."): a model that answers "(a) Rollo (b) Ragnar" picked "Rollo". Linear time: each run of whitespace is
read as one token (the same reading with a lazy group would be quadratic in a run of spaces)."""
