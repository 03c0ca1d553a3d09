"""Liu et al., Appendix A, Figure 9: the one-shot chain-of-thought Summary prompt (section 3.2.2)."""

from __future__ import annotations

from haystack_fusion.prompts.examples import one_shot_cot_template

TEMPLATE = one_shot_cot_template(
    rationale_format="a step-by-step summary that identifies the correct response",
    demo_rationale="The question requires information on the 2009 movie that Peter Outerbridge was in as William "
    'Easton. From the sources, we can narrow down our focus to Source 3 that mentions "Saw VI", a movie released in '
    "2009, in which Peter Outerbridge starred. By summarizing these details, the movie from 2009 featuring Peter "
    "Outerbridge is Saw VI.",
)
"""Variables: `passages` (a `format_passages` block of the top-k passages), `query`. The demonstration's rationale
summarizes the relevant sources before answering ("Summary Reasoning Demo")."""
