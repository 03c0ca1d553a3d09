"""
Serving the strategies with Hayhooks.

- `haystack_fusion.serving.yaml`: generates `pipelines/` (a wrapper folder per strategy, the production YAML in
  `pipelines/yaml/`) from the strategy registry; needs no extra.
- `haystack_fusion.serving.hayhooks`: `StrategyPipelineWrapper`, the wrappers' base class: backend checks at setup,
  `/{name}/run`, and the OpenAI-compatible chat endpoint with streamed status, answer, sources and evidence (the
  `serve` extra).

Neither is imported here, so importing the package needs no extra.
"""
