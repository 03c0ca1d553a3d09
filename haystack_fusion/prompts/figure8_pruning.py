"""Liu et al., Appendix A, Figure 8: the one-shot chain-of-thought Pruning prompt (section 3.2.2)."""

from __future__ import annotations

from haystack_fusion.prompts.examples import one_shot_cot_template

TEMPLATE = one_shot_cot_template(
    rationale_format="a step-by-step deduction that identifies the correct response",
    demo_rationale="The question is asking for the 2009 movie that Peter Outerbridge was in as William Easton. We can "
    "use process of pruning to figure this out. Source 1 doesn't contain the information. In source 2, it talks about "
    'a made-for-TV movie in 2004. In source 3, it talks about the sixth installment in the "Saw" franchise. This must '
    "be the movie we are looking for.",
)
"""Variables: `passages` (a `format_passages` block of the top-k passages), `query`. The demonstration's rationale
eliminates irrelevant sources one by one ("Elimination Reasoning Demo")."""
