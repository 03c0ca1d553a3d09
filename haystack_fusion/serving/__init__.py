"""
Serving the strategies with Hayhooks.

- `haystack_fusion.serving.app`: the served app (`haystack-fusion serve`): Hayhooks' app with the strategy set fixed
  at startup (no deploy routes or tools), CORS pinned and `HAYSTACK_FUSION_API_KEY` on every route but `/status`
  (the `serve` extra).
- `haystack_fusion.serving.yaml`: generates `pipelines/` (a wrapper folder per strategy, every strategy's YAML on
  the backend you name in `pipelines/yaml/`) from the strategy registry; needs no extra.
- `haystack_fusion.serving.hayhooks`: `StrategyPipelineWrapper`, the wrappers' base class: backend checks at setup,
  `/{name}/run`, and the OpenAI-compatible chat endpoint with streamed status, answer, sources and evidence (the
  `serve` extra).
- `haystack_fusion.serving.limits`: what a served wrapper admits (the question's length, a process-wide admission
  limit with a bounded queue; overload is refused with HTTP 503); needs no extra.
- `haystack_fusion.serving.chat`: what a chat client sends (content parts, background tasks, the chat before a
  follow-up) and the one LLM call that rewrites a follow-up into a standalone question; needs no extra.
- `haystack_fusion.serving.presentation`: a run's stages, evidence and sources as `haystack-fusion ask` and the
  served stream show them; needs no extra.
- `haystack_fusion.serving.guards`: the ASGI middleware in front of the served apps (Host, Origin, body size, the
  client's disconnect, OpenAI's error shape and stream end; the `serve` extra).

None is imported here, so importing the package needs no extra.
"""
