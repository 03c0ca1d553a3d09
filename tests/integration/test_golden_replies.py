"""
The embedded model gives the same greedy replies on every machine: a golden test.

The prompts are the first-round calls of four strategies (concatenation's prompt, post-fusion's per-passage calls,
SuRe's few-shot candidate prompt, Chain-of-Note's single-call prompt) for four questions over eight short passages
written for this test, BM25 top-3, as the strategies' own pipelines build them (recorded through a scripted
generator). Each goes through the embedded generator with the call's own generation settings (replies cut at
`MAX_TOKENS`), once with 1 thread and once with 2, and its reply text and token counts must equal the committed
golden file, `golden/embedded_replies.json`.

The golden file belongs to one llama.cpp build: the llama-cpp-python version and the instruction set the Makefile
builds (x86-64-v3 on x86_64; its system-info line is recorded). A build for the host's own CPU (`LLAMA_NATIVE=1`)
runs other kernels and is skipped with the reason, except under CI (`CI` set), where any other build fails.

When a prompt template changes on purpose, the prompts' hashes do not match and the test says so: write the file
again with `HAYSTACK_FUSION_WRITE_GOLDEN=1 .venv/bin/pytest tests/integration/test_golden_replies.py` on the
Makefile's build, and commit it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from haystack import Document
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends.local import (
    _LOADED,
    LOCAL_GENERATION_KWARGS,
    LocalChatGenerator,
    llama_cpp_runtime,
    use_extra_buffer_types,
)
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import ScriptedChatGenerator

pytestmark = pytest.mark.skipif(LocalChatGenerator is None, reason="the `local` extra is not installed")

GOLDEN = Path(__file__).parent / "golden" / "embedded_replies.json"
WRITE_ENV = "HAYSTACK_FUSION_WRITE_GOLDEN"
MAX_TOKENS = 48
"""Completion tokens per reply at most: enough to tell two builds apart, few enough for a quick test."""
TOP_K = 3
STRATEGIES = ("concatenation", "post_fusion", "sure", "chain_of_note")

PASSAGES = [
    (
        "Kestrel Bridge",
        "The Kestrel Bridge crosses the Varn River at the town of Eddington. Construction began in 1887 and the "
        "bridge opened to carts in 1891. Its engineer, Miriam Hollis, chose a three-span iron truss because the "
        "riverbed could not hold a single long arch. The bridge was widened for motor traffic in 1934.",
    ),
    (
        "Varn River",
        "The Varn River rises in the Calder Hills and flows 212 kilometres east to the sea at Port Amsel. Eddington, "
        "the largest town on its banks, grew around a ford that was replaced by a bridge in the nineteenth century. "
        "Salmon return to the upper Varn each autumn.",
    ),
    (
        "Miriam Hollis",
        "Miriam Hollis (1851-1920) was a civil engineer known for iron truss bridges. She trained in Glasgow, worked "
        "on railway viaducts in the north, and later taught structural design at the Eddington Technical College, "
        "which she helped to found in 1899.",
    ),
    (
        "Port Amsel",
        "Port Amsel is a harbour town at the mouth of the Varn River. Its lighthouse, painted in red and white "
        "bands, was lit for the first time in 1862. Fishing and a ferry to the islands of Orr are the main trades "
        "of the town.",
    ),
    (
        "Orr islands",
        "The Orr islands are a group of seven small islands reached by ferry from Port Amsel. Only the largest, "
        "Great Orr, has people living on it all year. The islands are known for their puffin colonies and for a "
        "stone circle older than any building on the mainland.",
    ),
    (
        "Calder Hills",
        "The Calder Hills are a range of low, rounded hills of sandstone. Their highest point, Brannock Top, reaches "
        "641 metres. Several rivers, among them the Varn and the Tull, have their sources in the peat bogs of the "
        "high plateau.",
    ),
    (
        "Eddington Technical College",
        "Eddington Technical College was founded in 1899 to train engineers and surveyors. It became part of the "
        "University of the East Coast in 1965. Its oldest building, Hollis Hall, is named after one of its "
        "founders.",
    ),
    (
        "Tull River",
        "The Tull River is a short river that flows south from the Calder Hills to join the Varn above Eddington. "
        "A mill on the Tull ground grain for the town until 1950; the mill house is now a museum of rural life.",
    ),
]

QUESTIONS = [
    "Who designed the Kestrel Bridge?",
    "In which year was the lighthouse of Port Amsel first lit?",
    "How high is Brannock Top?",
    "What colour is the ferry to the Orr islands?",  # no passage says: "unknown" is right
]


def _retriever() -> InMemoryBM25Retriever:
    store = InMemoryDocumentStore()
    store.write_documents([Document(content=text, meta={"title": title}) for title, text in PASSAGES])
    return InMemoryBM25Retriever(document_store=store, top_k=TOP_K)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def first_round_calls() -> list[dict[str, Any]]:
    """
    The first-round LLM calls of each strategy for each question, as the strategies' pipelines make them.

    :returns: One `{"id", "messages", "generation_kwargs", "prompt_sha256"}` per call, in a fixed order (a fan-out's
        concurrent calls sorted by prompt).
    """
    calls: list[dict[str, Any]] = []
    for q_index, question in enumerate(QUESTIONS):
        for strategy in STRATEGIES:
            # "unknown" to every call, so each strategy stops after its first round
            recorder = ScriptedChatGenerator("unknown", generation_kwargs=dict(LOCAL_GENERATION_KWARGS))
            pipeline = build_pipeline(strategy, retriever=_retriever(), chat_generator=recorder, few_shot=True)
            run_strategy(pipeline, question)
            llm = recorder  # a one-prompt chain sends its prompt's stop sequences with the call
            first = llm.messages[:TOP_K] if strategy == "post_fusion" else llm.messages[:1]
            kwargs = [{**llm.generation_kwargs, **(call or {})} for call in llm.kwargs[: len(first)]]
            recorded = sorted(zip(first, kwargs, strict=True), key=lambda call: call[0][-1].text or "")
            for c_index, (messages, generation_kwargs) in enumerate(recorded):
                text = "\n\n".join(message.text or "" for message in messages)
                calls.append(
                    {
                        "id": f"q{q_index + 1}/{strategy}/{c_index + 1}",
                        "messages": messages,
                        "generation_kwargs": {**generation_kwargs, "max_tokens": MAX_TOKENS},
                        "prompt_sha256": _sha256(text + json.dumps(generation_kwargs, sort_keys=True)),
                    }
                )
    return calls


def replies(calls: list[dict[str, Any]], threads: int) -> list[dict[str, Any]]:
    """Each call's greedy reply on the embedded model with `threads` threads (prompt and batch), reply cache off."""
    llm = LocalChatGenerator(reply_cache=False, model_kwargs={"n_threads": threads, "n_threads_batch": threads})
    llm.warm_up()
    out = []
    for call in calls:
        messages: list[ChatMessage] = call["messages"]
        reply = llm.run(messages, generation_kwargs=call["generation_kwargs"])["replies"][0]
        usage = reply.meta["usage"]
        out.append(
            {
                "id": call["id"],
                "prompt_sha256": call["prompt_sha256"],
                "prompt_tokens": usage["prompt_tokens"],
                "completion_tokens": usage["completion_tokens"],
                "reply": reply.text,
            }
        )
    return out


@pytest.fixture(scope="module")
def calls() -> list[dict[str, Any]]:
    return first_round_calls()


@pytest.fixture(scope="module")
def build() -> dict[str, str]:
    return llama_cpp_runtime()


def test_the_prompts_cover_the_strategies(calls):
    assert len(calls) >= 20
    assert {call["id"].split("/")[1] for call in calls} == set(STRATEGIES)
    assert len({call["prompt_sha256"] for call in calls}) == len(calls)


def test_the_model_loads_without_the_amx_kernels_on_an_amx_build(build):
    llm = LocalChatGenerator(reply_cache=False)
    llm.warm_up()
    assert llm._shared is not None
    assert llm._shared.llama.model_params.use_extra_bufts is use_extra_buffer_types(build["system_info"])


@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_replies_match_the_golden_file(calls, build, threads):
    if os.environ.get(WRITE_ENV):
        if threads == 1:
            made = {**build, "max_tokens": MAX_TOKENS, "replies": replies(calls, threads)}
            GOLDEN.parent.mkdir(exist_ok=True)
            GOLDEN.write_text(json.dumps(made, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        pytest.skip(f"{WRITE_ENV} is set: {GOLDEN.name} was written on this build")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    made_on = {key: golden[key] for key in ("llama_cpp_python", "system_info")}
    if build != made_on:
        message = f"the golden replies belong to the Makefile's build {made_on}, and this is {build}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    expected = golden["replies"]
    changed = [
        call["id"]
        for call, gold in zip(calls, expected, strict=False)
        if call["prompt_sha256"] != gold["prompt_sha256"]
    ]
    again = f"write the golden file again ({WRITE_ENV}=1)"
    assert [call["id"] for call in calls] == [gold["id"] for gold in expected], f"the calls changed: {again}"
    assert not changed, f"the prompts of {changed} changed: {again}"
    try:
        got = replies(calls, threads)
    finally:
        _LOADED.clear()  # one model per thread count; free it for the rest of the suite
    differ = [(gold["id"], gold, mine) for gold, mine in zip(expected, got, strict=True) if gold != mine]
    assert not differ, f"{len(differ)} of {len(got)} replies differ on {threads} thread(s); first: {differ[0]}"
