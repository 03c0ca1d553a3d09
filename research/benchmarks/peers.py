"""
Benchmark: our fan-outs side by side with their peers' in one run, against one latency-injecting OpenAI-compatible
server (issue 14 item 5).

The script starts `tests.support.openai_server` on 127.0.0.1 in a child process (a free port; it stops by
itself after `--lifetime` seconds, or when this script ends) with a fixed latency per request and replies shaped by the
prompt's closing words, so every system parses what it gets (post-fusion and the peers: "Paris"; SuRe: "(a) Paris, (b)
Lyon", a summary, "True", "Passage 1"; LangChain's map_rerank: "Paris" and a "Score:" line). For k = 5, 10, 20, 50
synthetic passages it runs, one after another:

- the floor: k calls with the openai client alone, in one `asyncio.gather` and from k threads: what every system
  built on that client pays for k requests on the machine at hand;
- ours: `PostFusionVoter` (k calls) and SuRe, `CandidateSummarizer` + `SummaryVerifier` at K = 2 (1 + 2 + (2 + 2)
  calls in 3 dependent rounds), with Haystack's `OpenAIChatGenerator`, through `run_async` and the sync `run`, at
  the default settings (no `max_concurrency`);
- LlamaIndex: `get_response_synthesizer(response_mode=ResponseMode.ACCUMULATE, use_async=True)` over k nodes, awaited
  (`asynthesize`). Its OpenAI integration (`llama-index-llms-openai`) requires openai < 3 and this project's
  environment has openai 3, so the LLM is a `CustomLLM` that sends `acomplete` through `openai.AsyncOpenAI`, as
  that integration does (a `CustomLLM` without its own `acomplete` would run the calls one after another);
- LangChain: an LCEL chain `prompt | ChatOpenAI | StrOutputParser` with `.batch(inputs, config={"max_concurrency":
  k})`, and the `map_rerank` QA chain (`langchain_classic`'s `load_qa_chain(llm, chain_type="map_rerank")`) with
  `invoke` and `ainvoke`, given replies with a "Score:" line, and once more with the plain replies the other systems
  get (its parser then raises: a crash, counted as a failure);
- SuRe's official code, reduced to its call structure: the same 7 calls made one after another with
  `openai.OpenAI().chat.completions.create`, as that code calls the API.

Per system and k it prints the wall time of one question (median of `--repeats` runs after one untimed warm-up
run), that time as a ratio to one call's wall time (one `chat.completions.create`, measured in the same run through
the same server), the most requests the server had under way at once, the requests it received, and the failures
(failed calls a system reported, or the exception it raised). A peer that cannot be imported gets a row that says so.
The server's counters are reset before each run.

Install the peers (the `bench` extra) and run:
`.venv/bin/pip install -e ".[bench]"` then
`.venv/bin/python -m research.benchmarks.peers [--latency 0.2] [--ks 5,10,20,50] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import inspect
import multiprocessing
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from multiprocessing.connection import Connection
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.utils import Secret

from haystack_fusion import CandidateSummarizer, PostFusionVoter, SummaryVerifier
from haystack_fusion.prompts import PROMPTS, format_passages, render
from haystack_fusion.prompts.sure import candidate_prompt_variables
from tests.support.openai_server import OpenAIServer

MODEL = "bench-model"
QUERY = "What is the capital of France?"
ANSWER = "Paris"
SURE_CANDIDATES = 2
"""K, SuRe's answer candidates: the paper's setting (paper 002, section 4)."""

Run = Callable[[], int] | Callable[[], Awaitable[int]]
"""One question: returns the failed calls the system reported (0 when it reports none), or raises."""


class Replies:
    """The server's replies, chosen by the closing words of the request's last message."""

    def __init__(self) -> None:
        self.scores = True
        """Answer map_rerank's prompt with a "Score:" line (its parser needs it); False: the plain answer."""

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or [{}]
        content = messages[-1].get("content") or ""
        if isinstance(content, list):  # content parts
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        text = str(content).strip()
        if text.endswith("Helpful Answer:"):  # LangChain's map_rerank prompt
            return f"{ANSWER}\nScore: 100" if self.scores else ANSWER
        if text.startswith("Below are") and "correct candidates" in text:  # SuRe Listing 6
            return "(a) Paris, (b) Lyon"
        if "act as a professional writer" in text:  # SuRe Listing 7
            return "Paris is the capital of France, as the passages say. [DONE]"
        if text.endswith("Choices: [True, False]. Answer:"):  # SuRe Listing 8
            return "True"
        if "Choices: [Passage 1, Passage 2]." in text:  # SuRe Listing 9
            return "Passage 1"
        return ANSWER  # post-fusion's Figure 7, LlamaIndex's QA prompt, the LCEL prompt


def serve(pipe: Connection, latency: float, lifetime: float) -> None:
    """
    The child process: an `OpenAIServer` with `Replies`, driven by commands from the pipe until the parent closes
    it, asks it to stop, or `lifetime` seconds pass.
    """
    replies = Replies()
    deadline = time.monotonic() + lifetime
    with OpenAIServer(reply=replies, latency=latency, max_requests=10_000, lifetime=lifetime) as server:
        pipe.send(server.base_url)
        while time.monotonic() < deadline:
            if not pipe.poll(1.0):
                continue
            try:
                command, argument = pipe.recv()
            except EOFError:  # the parent is gone
                break
            if command == "stop":
                pipe.send(None)
                break
            if command == "reset":
                server.reset()
            elif command == "scores":
                replies.scores = bool(argument)
            stats = server.stats
            pipe.send(
                {
                    "requests": stats.requests,
                    "in_flight": stats.in_flight,
                    "max_in_flight": stats.max_in_flight,
                    "refused": stats.refused,
                }
            )


class ServerProcess:
    """
    `tests.support.openai_server`'s server in a child process of its own, so that answering requests does
    not take the interpreter lock from the clients being measured; its counters are read and reset over a pipe.

    :param latency: Seconds the server waits before each reply.
    :param lifetime: Seconds after which the server stops by itself.
    """

    def __init__(self, latency: float, lifetime: float) -> None:
        self.latency = latency
        self.lifetime = lifetime
        self.base_url = ""
        self._pipe: Connection | None = None
        self._process: Any = None

    def __enter__(self) -> ServerProcess:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=serve, args=(child, self.latency, self.lifetime), name="peers-openai-server", daemon=True
        )
        self._process.start()
        child.close()
        if not self._pipe.poll(60):
            self.__exit__()
            raise RuntimeError("the OpenAI-compatible server did not start within 60 s")
        self.base_url = self._pipe.recv()
        return self

    def _command(self, command: str, argument: Any = None) -> dict[str, int]:
        assert self._pipe is not None
        self._pipe.send((command, argument))
        return self._pipe.recv()

    def stats(self) -> dict[str, int]:
        """`requests`, `in_flight`, `max_in_flight` and `refused` since the last reset."""
        return self._command("stats")

    def reset(self) -> None:
        self._command("reset")

    def set_scores(self, scores: bool) -> None:
        """Whether map_rerank's prompt gets a "Score:" line in its reply."""
        self._command("scores", scores)

    def __exit__(self, *exc_info: object) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError, EOFError):
                self._command("stop")
            self._pipe.close()
        if self._process is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.terminate()  # our own child, by its handle
                self._process.join(5)


@dataclass
class Setup:
    """What every system gets: the server and the passages."""

    server: ServerProcess
    documents: list[Document]

    @property
    def base_url(self) -> str:
        return self.server.base_url


@dataclass
class Trial:
    """A system ready to answer: `run` answers one question (sync or async); `close` (sync or async, awaited in the
    async run's event loop) releases its clients when the measurements are done."""

    run: Run
    close: Callable[[], Any] | None = None


@dataclass
class Sample:
    seconds: float
    requests: int
    max_in_flight: int
    failed: int
    error: str | None


@dataclass
class Row:
    system: str
    k: int
    seconds: float | None
    ratio: float | None
    max_in_flight: int | None
    requests: int | None
    failures: str


def passages(k: int) -> list[Document]:
    """k synthetic passages, each naming the answer."""
    return [
        Document(content=f"Passage {i}: Paris is the capital and largest city of France.", meta={"title": f"Doc {i}"})
        for i in range(k)
    ]


def haystack_generator(setup: Setup) -> OpenAIChatGenerator:
    return OpenAIChatGenerator(api_base_url=setup.base_url, api_key=Secret.from_token("x"), model=MODEL)


def usage_failures(*usages: dict[str, Any]) -> int:
    return sum(int(usage.get("failed_calls") or 0) for usage in usages)


# --- ours -------------------------------------------------------------------------------------------------------


def ours_post_fusion(setup: Setup, *, sync: bool) -> Trial:
    voter = PostFusionVoter(chat_generator=haystack_generator(setup))

    def run() -> int:
        answers = voter.run(query=QUERY, documents=setup.documents)["answers"]
        return usage_failures(answers[0].meta["usage"])

    async def run_async() -> int:
        answers = (await voter.run_async(query=QUERY, documents=setup.documents))["answers"]
        return usage_failures(answers[0].meta["usage"])

    return Trial(run, voter.close) if sync else Trial(run_async, voter.close_async)


def ours_sure(setup: Setup, *, sync: bool) -> Trial:
    generator = haystack_generator(setup)  # one generator for both components, as a pipeline would share it
    summarizer = CandidateSummarizer(chat_generator=generator, num_candidates=SURE_CANDIDATES)
    verifier = SummaryVerifier(chat_generator=generator)

    def check(summarized: dict[str, Any], verified: dict[str, Any]) -> int:
        answer = verified["answers"][0]
        if answer.data != ANSWER:
            raise AssertionError(f"SuRe answered {answer.data!r}")
        return usage_failures(summarized["meta"]["usage"], answer.meta["usage"])

    def run() -> int:
        summarized = summarizer.run(query=QUERY, documents=setup.documents)
        verified = verifier.run(query=QUERY, candidates=summarized["candidates"], summaries=summarized["summaries"])
        return check(summarized, verified)

    async def run_async() -> int:
        summarized = await summarizer.run_async(query=QUERY, documents=setup.documents)
        verified = await verifier.run_async(
            query=QUERY, candidates=summarized["candidates"], summaries=summarized["summaries"]
        )
        return check(summarized, verified)

    return Trial(run, summarizer.close) if sync else Trial(run_async, summarizer.close_async)


# --- peers ------------------------------------------------------------------------------------------------------


def llama_index_accumulate(setup: Setup) -> Trial:
    import openai
    from llama_index.core import get_response_synthesizer
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.response_synthesizers import ResponseMode
    from llama_index.core.schema import NodeWithScore, TextNode

    base_url = setup.base_url
    clients: list[openai.AsyncOpenAI] = []

    def async_client() -> openai.AsyncOpenAI:
        """One AsyncOpenAI client, made in the event loop that uses it (an httpx async client belongs to it)."""
        if not clients:
            clients.append(openai.AsyncOpenAI(base_url=base_url, api_key="x"))
        return clients[0]

    class ServerLLM(CustomLLM):
        """The test server as a LlamaIndex completion LLM; async calls through `openai.AsyncOpenAI`."""

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(model_name=MODEL, context_window=8192, num_output=64)

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            client = openai.OpenAI(base_url=base_url, api_key="x")
            reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
            return CompletionResponse(text=reply.choices[0].message.content or "")

        @llm_completion_callback()
        async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            reply = await async_client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}]
            )
            return CompletionResponse(text=reply.choices[0].message.content or "")

        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
            raise NotImplementedError("not streamed in this benchmark")

    synthesizer = get_response_synthesizer(llm=ServerLLM(), response_mode=ResponseMode.ACCUMULATE, use_async=True)
    nodes = [NodeWithScore(node=TextNode(text=document.content or ""), score=1.0) for document in setup.documents]

    async def run() -> int:
        response = await synthesizer.asynthesize(QUERY, nodes=nodes)
        if str(response).count(ANSWER) != len(nodes):
            raise AssertionError(f"accumulate gave {str(response)[:80]!r}")
        return 0

    async def close() -> None:
        for client in clients:
            await client.close()

    return Trial(run, close)


def langchain_lcel_batch(setup: Setup) -> Trial:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    prompt = ChatPromptTemplate.from_template("Context: {context}\n\nQuestion: {question}\n\nAnswer:")
    chain = prompt | ChatOpenAI(base_url=setup.base_url, api_key=SecretStr("x"), model=MODEL) | StrOutputParser()
    inputs = [{"context": document.content, "question": QUERY} for document in setup.documents]

    def run() -> int:
        replies = chain.batch(inputs, config={"max_concurrency": len(inputs)})
        if replies != [ANSWER] * len(inputs):
            raise AssertionError(f"LCEL batch gave {replies[:3]!r}")
        return 0

    return Trial(run)


def langchain_map_rerank(setup: Setup, *, sync: bool, scores: bool) -> Trial:
    from langchain_classic.chains.question_answering import load_qa_chain
    from langchain_core.documents import Document as LangChainDocument
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    # load_qa_chain, LLMChain and apply_and_parse are deprecated (warned at every call) and still shipped
    warnings.filterwarnings("ignore", module=r"langchain_classic\.")
    warnings.filterwarnings("ignore", message=r".*(deprecated|LLMChain).*")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = ChatOpenAI(base_url=setup.base_url, api_key=SecretStr("x"), model=MODEL)
        chain = load_qa_chain(llm, chain_type="map_rerank")
    inputs = {
        "input_documents": [LangChainDocument(page_content=document.content or "") for document in setup.documents],
        "question": QUERY,
    }

    def check(result: dict[str, Any]) -> int:
        if result["output_text"].strip() != ANSWER:
            raise AssertionError(f"map_rerank gave {result['output_text']!r}")
        return 0

    def run() -> int:
        return check(chain.invoke(inputs))

    async def run_async() -> int:
        return check(await chain.ainvoke(inputs))

    setup.server.set_scores(scores)
    return Trial(run if sync else run_async, lambda: setup.server.set_scores(True))


def official_sure_sequential(setup: Setup) -> Trial:
    """SuRe's 7 calls at K = 2 (candidates; 2 summaries; 2 validity; 2 rankings), one after another."""
    import openai

    client = openai.OpenAI(base_url=setup.base_url, api_key="x")
    passages_text = format_passages(setup.documents, layout="titled")

    def ask(prompt: str, **variables: Any) -> str:
        text = render(PROMPTS[prompt], **variables)[-1].text or ""
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])
        return reply.choices[0].message.content or ""

    def run() -> int:
        reply = ask(
            "sure_candidates",
            num_passages=len(setup.documents),
            passages=passages_text,
            query=QUERY,
            **candidate_prompt_variables(SURE_CANDIDATES),
        )
        candidates = [c.strip() for c in re.findall(r"\([a-z]\)\s*([^,(]+)", reply)][:SURE_CANDIDATES]
        summaries = [
            ask("sure_summary", passages=passages_text, query=QUERY, candidates=candidates, target=index)
            .split("[DONE]")[0]
            .strip()
            for index in range(len(candidates))
        ]
        valid = [
            ask("sure_validity", query=QUERY, prediction=candidate, summary=summary).strip() == "True"
            for candidate, summary in zip(candidates, summaries, strict=True)
        ]
        wins = [0.0] * len(candidates)
        for i in range(len(candidates)):
            for j in range(len(candidates)):
                if i != j:
                    choice = ask("sure_ranking", query=QUERY, summary_1=summaries[i], summary_2=summaries[j])
                    wins[i if "1" in choice else j] += 0.5
        best = max(range(len(candidates)), key=lambda n: (valid[n] + wins[n], -n))
        if candidates[best] != ANSWER:
            raise AssertionError(f"sequential SuRe answered {candidates[best]!r}")
        return 0

    return Trial(run, client.close)


# --- the floor: the openai client alone ---------------------------------------------------------------------------


def openai_gather(setup: Setup) -> Trial:
    """k `AsyncOpenAI` calls in one `asyncio.gather`, no framework: what any async fan-out on this client pays."""
    import openai

    clients: list[openai.AsyncOpenAI] = []

    async def run() -> int:
        if not clients:  # made in the event loop that uses it
            clients.append(openai.AsyncOpenAI(base_url=setup.base_url, api_key="x"))
        prompts = [f"Context: {document.content}\n\nQuestion: {QUERY}\n\nAnswer:" for document in setup.documents]
        await asyncio.gather(
            *(
                clients[0].chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
                for prompt in prompts
            )
        )
        return 0

    async def close() -> None:
        for client in clients:
            await client.close()

    return Trial(run, close)


def openai_threads(setup: Setup) -> Trial:
    """k `OpenAI` calls from k threads of a pool kept between questions, no framework."""
    import openai

    client = openai.OpenAI(base_url=setup.base_url, api_key="x")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(setup.documents))
    prompts = [f"Context: {document.content}\n\nQuestion: {QUERY}\n\nAnswer:" for document in setup.documents]

    def call(prompt: str) -> Any:
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])

    def run() -> int:
        list(pool.map(call, prompts))
        return 0

    def close() -> None:
        pool.shutdown()
        client.close()

    return Trial(run, close)


SYSTEMS: list[tuple[str, Callable[[Setup], Trial]]] = [
    ("floor: openai AsyncOpenAI, asyncio.gather of k calls", openai_gather),
    ("floor: openai OpenAI, k threads", openai_threads),
    ("ours: PostFusionVoter, run_async", lambda s: ours_post_fusion(s, sync=False)),
    ("ours: PostFusionVoter, run", lambda s: ours_post_fusion(s, sync=True)),
    ("ours: SuRe K=2, run_async", lambda s: ours_sure(s, sync=False)),
    ("ours: SuRe K=2, run", lambda s: ours_sure(s, sync=True)),
    ("LlamaIndex accumulate, use_async (asynthesize)", llama_index_accumulate),
    ("LangChain LCEL batch(max_concurrency=k)", langchain_lcel_batch),
    ("LangChain map_rerank, invoke", lambda s: langchain_map_rerank(s, sync=True, scores=True)),
    ("LangChain map_rerank, ainvoke", lambda s: langchain_map_rerank(s, sync=False, scores=True)),
    ("LangChain map_rerank, invoke, plain replies", lambda s: langchain_map_rerank(s, sync=True, scores=False)),
    ("SuRe official code: 7 sequential calls (K=2)", official_sure_sequential),
]

PEER_PACKAGES = (
    "haystack-ai",
    "openai",
    "llama-index-core",
    "langchain-core",
    "langchain-classic",
    "langchain-openai",
)


# --- measuring --------------------------------------------------------------------------------------------------


def settle(server: ServerProcess, timeout: float = 30.0) -> None:
    """Wait until the server has no request under way (a crashed run may leave some behind)."""
    deadline = time.monotonic() + timeout
    while server.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)


def sample(server: ServerProcess, seconds: float, failed: int, error: BaseException | None) -> Sample:
    stats = server.stats()
    message = None if error is None else f"crash: {type(error).__name__}: {str(error).splitlines()[0][:60]}"
    return Sample(seconds, stats["requests"], stats["max_in_flight"], failed + stats["refused"], message)


def measure_sync(server: ServerProcess, run: Callable[[], int], runs: int) -> list[Sample]:
    samples = []
    for _ in range(runs):
        settle(server)
        server.reset()
        start = time.perf_counter()
        failed, error = 0, None
        try:
            failed = run()
        except Exception as caught:  # a crash is a result here
            error = caught
        samples.append(sample(server, time.perf_counter() - start, failed, error))
    return samples


async def measure_async(server: ServerProcess, trial: Trial, runs: int) -> list[Sample]:
    samples = []
    for _ in range(runs):
        settle(server)
        server.reset()
        start = time.perf_counter()
        failed, error = 0, None
        try:
            failed = await trial.run()  # type: ignore[misc]
        except Exception as caught:
            error = caught
        samples.append(sample(server, time.perf_counter() - start, failed, error))
    if trial.close is not None:  # in the loop the clients belong to
        closed = trial.close()
        if inspect.isawaitable(closed):
            await closed
    return samples


def measure(server: ServerProcess, trial: Trial, repeats: int) -> list[Sample]:
    """One untimed warm-up run, then `repeats` timed ones (an async system's all in one event loop)."""
    if inspect.iscoroutinefunction(trial.run):
        return asyncio.run(measure_async(server, trial, repeats + 1))[1:]
    try:
        return measure_sync(server, trial.run, repeats + 1)[1:]  # type: ignore[arg-type]
    finally:
        if trial.close is not None:
            trial.close()


def single_call_seconds(setup: Setup, repeats: int) -> tuple[float, float]:
    """
    Median wall time of one `openai.OpenAI().chat.completions.create` through the server (the ratios' unit), and of
    one Haystack `OpenAIChatGenerator.run` (Haystack's own cost per call, for reference); each after a warm-up call.
    """
    import openai
    from haystack.dataclasses import ChatMessage

    client = openai.OpenAI(base_url=setup.base_url, api_key="x")
    generator = haystack_generator(setup)
    messages = [{"role": "user", "content": "Say Paris. Answer:"}]

    def openai_call() -> int:
        client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        return 0

    def haystack_call() -> int:
        generator.run([ChatMessage.from_user("Say Paris. Answer:")])
        return 0

    runs = max(repeats, 5) + 1
    one = statistics.median(s.seconds for s in measure_sync(setup.server, openai_call, runs)[1:])
    haystack = statistics.median(s.seconds for s in measure_sync(setup.server, haystack_call, runs)[1:])
    client.close()
    return one, haystack


def row(system: str, k: int, samples: list[Sample], one_call: float) -> Row:
    seconds = statistics.median(s.seconds for s in samples)
    errors = sorted({s.error for s in samples if s.error})
    failed = sum(s.failed for s in samples)
    failures = "; ".join(errors) if errors else (f"{failed} failed calls in {len(samples)} runs" if failed else "0")
    return Row(
        system,
        k,
        seconds,
        seconds / one_call,
        max(s.max_in_flight for s in samples),
        max(s.requests for s in samples),
        failures,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| system | k | wall s | x one call | max in flight | requests | failures |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.seconds is None:
            lines.append(f"| {r.system} | {r.k} | - | - | - | - | {r.failures} |")
            continue
        lines.append(
            f"| {r.system} | {r.k} | {r.seconds:.3f} | {r.ratio:.2f}x | {r.max_in_flight} | {r.requests} "
            f"| {r.failures} |"
        )
    return "\n".join(lines)


def versions() -> str:
    found = []
    for package in PEER_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{package} {metadata.version(package)}")
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server waits before each reply")
    parser.add_argument("--ks", default="5,10,20,50", help="passages per question, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per system and k (median reported)")
    parser.add_argument("--lifetime", type=float, default=1800.0, help="seconds after which the server stops itself")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    rows: list[Row] = []
    with ServerProcess(args.latency, args.lifetime) as server:
        one_call, haystack_call = single_call_seconds(Setup(server, passages(1)), args.repeats)
        for k in ks:
            setup = Setup(server, passages(k))
            for name, build in SYSTEMS:
                try:
                    trial = build(setup)
                except ImportError as error:  # a peer not installed
                    rows.append(Row(name, k, None, None, None, None, f"not installed: {error.name or error}"))
                    continue
                started = time.perf_counter()
                rows.append(row(name, k, measure(server, trial, args.repeats), one_call))
                print(f"k={k} {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    order = {name: index for index, (name, _) in enumerate(SYSTEMS)}
    rows.sort(key=lambda r: (order[r.system], r.k))
    print(
        f"Latency {args.latency:.3f} s per request. One call (`chat.completions.create`, the ratios' unit): "
        f"{one_call:.3f} s; one Haystack `OpenAIChatGenerator.run`: {haystack_call:.3f} s "
        f"({haystack_call / one_call:.2f}x). Medians of {args.repeats} runs after a warm-up; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs.\n"
    )
    print(versions() + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
