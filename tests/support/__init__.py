"""
The test suite's and research benchmarks' own helpers, not shipped: `openai_server` (a local OpenAI-compatible server
with latency, fault injection and request counters; FastAPI and uvicorn, the `dev` extra), `serve_process`
(`haystack-fusion serve` in a child process) and `fuzzing` (hypothesis strategies of hostile model replies and the
table of every parser of model output). The test doubles users can reuse are in `haystack_fusion.testing`.
"""
