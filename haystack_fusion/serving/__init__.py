"""
Serving the strategies with Hayhooks: `app` (`haystack-fusion serve`), `hayhooks` (the pipeline wrappers), `guards`
(the ASGI middleware in front of them) need the `serve` extra; `yaml` (generates `pipelines/`), `limits` (admission),
`chat` (what a chat client sends) and `presentation` (a run as shown) need none. None is imported here.
"""
