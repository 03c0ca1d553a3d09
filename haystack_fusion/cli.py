"""The `haystack-fusion` command: index passages, ask a question with a strategy, list strategies, run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import requests

from haystack_fusion import corpus
from haystack_fusion.backends import (
    BackendConfig,
    backend_error_message,
    backend_pipeline,
    check_document_store,
    exception_chain,
    failed_calls_message,
    fallback_config,
    index_documents,
    llama_cpp_runtime,
    warn_missing_logprobs,
)
from haystack_fusion.backends import chat_generator as backend_chat_generator
from haystack_fusion.backends import retriever as backend_retriever
from haystack_fusion.backends.errors import QUEUED_TIMEOUT_ADVICE
from haystack_fusion.corpus import SkippedFile, default_squad_path, load_passages, load_squad, local_path
from haystack_fusion.serving.presentation import format_run
from haystack_fusion.settings import (
    CACHE_DIR,
    DEFAULT_INDEX_PATH,
    MAX_CALLS_IN_FLIGHT_ENV,
    SQUAD_VARIABLE,
    STORE_VARIABLE,
    index_path,
    strategy_defaults,
    warn_deprecated,
)
from haystack_fusion.strategies import CASCADE_MIN_CONFIDENCE, CASCADE_MIN_VOTE_SHARE, STRATEGIES, run_strategy

DEFAULT_STORE = Path(DEFAULT_INDEX_PATH)
DEMO_STORE = CACHE_DIR / "demo-index.json"  # `demo`'s own store and index: never `index`'s
DEMO_ES_INDEX = "haystack_fusion_demo"
EXIT_FAILED_QUESTIONS = 3  # `eval` finished with failed question records

MAX_CONCURRENCY_HELP = (
    "LLM calls of one round under way at once, per question (default: all of the round's calls: k for post-fusion, "
    "K + K(K-1) for SuRe's verification)"
)


def _strategy_options(args: argparse.Namespace, llm: str) -> dict[str, Any]:
    """`StrategyConfig` fields from the flags given, else `settings.strategy_defaults(llm)`."""
    options = strategy_defaults(llm)
    if args.candidate_prompt is not None:
        options["few_shot"] = args.candidate_prompt == "few-shot"
    if args.note_max_tokens is not None:
        options["note_generation_kwargs"] = {"max_tokens": args.note_max_tokens}
    return {
        **options,
        "num_candidates": args.num_candidates,
        "allow_parametric_knowledge": args.parametric_knowledge == "on",
        "min_confidence": args.min_confidence,
        "min_vote_share": args.min_vote_share,
        "verifier_scoring": args.verifier_scoring,
        **({"speculative": True} if args.speculative else {}),
        **{
            name: value
            for name in ("confidence", "agreement_samples", "agreement_temperature")
            if (value := getattr(args, name, None)) is not None
        },
    }


def _backends(args: argparse.Namespace) -> BackendConfig:
    """The `BackendConfig` of the backend flags and the environment."""
    llm = ("llm", "model", "api_base_url", "timeout", "max_retries", "max_tokens", "fallback_llm", "fallback_model")
    return BackendConfig.from_env(
        store=args.document_store,
        index_path=str(index_path(args.store)),
        elasticsearch_index=args.es_index,
        retriever=args.retriever,
        embedder=args.embedder,
        top_k=top_k if isinstance(top_k := getattr(args, "top_k", None), int) else None,
        logprobs=getattr(args, "logprobs", None) or None,
        llama_log=getattr(args, "llama_log", None) or None,
        fallback_api_base_url=getattr(args, "fallback_api_base_url", None),
        **{name: getattr(args, name, None) for name in llm},
    )


def _pipeline(
    strategy: str,
    config: BackendConfig,
    max_concurrency: int | None,
    options: dict[str, Any],
    chat_generator: Any = None,
) -> Any:
    check_document_store(config)
    return backend_pipeline(strategy, config, options, chat_generator=chat_generator, max_concurrency=max_concurrency)


def cmd_index(args: argparse.Namespace) -> int:
    """`haystack-fusion index SOURCE`."""
    skipped: list[SkippedFile] = []
    documents = load_passages(args.source, cache_dir=args.cache_dir, skipped=skipped)
    config = _backends(args)
    count = index_documents(config, documents, batch_size=args.batch_size, fresh=True)
    print(
        f"Indexed {len(documents)} passages from {args.source} into {_where(config)} ({count} in the store)"
        + _skipped_note(skipped)
    )
    return 0


def _skipped_note(skipped: list[SkippedFile], shown: int = 5) -> str:
    """E.g. `; skipped 2 files: a.txt (not UTF-8), b.md (empty)`."""
    if not skipped:
        return ""
    names = ", ".join(f"{skip.file} ({skip.reason})" for skip in skipped[:shown])
    more = f" and {len(skipped) - shown} more (the warnings above name them all)" if len(skipped) > shown else ""
    return f"; skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''}: {names}{more}"


def _where(config: BackendConfig) -> str:
    memory = config.store == "memory"
    return config.index_path if memory else f"{config.elasticsearch_url} index {config.elasticsearch_index!r}"


def cmd_ask(args: argparse.Namespace) -> int:
    """`haystack-fusion ask QUESTION`."""
    config = _backends(args)
    generator = backend_chat_generator(config)
    pipeline = _pipeline(args.strategy, config, args.max_concurrency, _strategy_options(args, config.llm), generator)
    run = run_strategy(pipeline, args.question, top_k=args.top_k)  # every call failed: `main` says why
    warn_missing_logprobs(generator, run.answers)  # a warning on stderr, once
    if args.json:
        print(json.dumps(run.to_dict(), indent=2, default=str))
    else:
        print(format_run(args.question, run))
    return 0


def cmd_strategies(_: argparse.Namespace) -> int:
    """`haystack-fusion strategies`."""
    width = max(len(name) for name in STRATEGIES)
    for strategy in STRATEGIES.values():
        print(f"{strategy.name:<{width}}  {strategy.summary} [{strategy.source}; LLM rounds: {strategy.rounds}]")
    return 0


def _download_failure(error: requests.RequestException) -> str:
    """ "HTTP 404", the operating system's words, or the error's type."""
    response = getattr(error, "response", None)
    if response is not None:
        return f"HTTP {response.status_code}"
    for link in exception_chain(error):
        if isinstance(link, OSError) and not isinstance(link, requests.RequestException) and link.strerror:
            return link.strerror
    return type(error).__name__


def _demo_dataset(args: argparse.Namespace) -> Path | None:
    """The demo's SQuAD file (`--dataset`, `$HAYSTACK_FUSION_SQUAD`, the dev set); None after a failed download."""
    try:
        if args.dataset:
            return local_path(args.dataset, cache_dir=args.cache_dir)
        return default_squad_path(cache_dir=args.cache_dir)
    except requests.RequestException as error:
        what = args.dataset or f"the SQuAD 2.0 dev set from {corpus.SQUAD_DEV_URL}"
        instead = (
            "pass a local SQuAD JSON file: haystack-fusion demo --dataset PATH (in a checkout: make demo DATASET=PATH)"
        )
        instead += "" if args.dataset else f", or set ${SQUAD_VARIABLE} to one"
        print(f"haystack-fusion: cannot download {what} ({_download_failure(error)}): {instead}", file=sys.stderr)
        return None


def cmd_demo(args: argparse.Namespace) -> int:
    """`haystack-fusion demo`: about half of the questions unanswerable ("unknown" is right)."""
    source = _demo_dataset(args)
    if source is None:
        return 2
    documents, questions = load_squad(source)
    config = _backends(args)
    index_documents(config, documents, fresh=True)
    print(f"Indexed {len(documents)} passages ({len(questions)} questions) from {source} into {_where(config)}\n")
    pipeline = _pipeline(args.strategy, config, args.max_concurrency, _strategy_options(args, config.llm))
    answerable = [question for question in questions if not question.is_impossible]
    unanswerable = [question for question in questions if question.is_impossible]
    n_unanswerable = min(args.questions // 2, len(unanswerable))
    chosen = answerable[: args.questions - n_unanswerable] + unanswerable[:n_unanswerable]
    for question in chosen:
        run = run_strategy(pipeline, question.question, top_k=args.top_k)
        gold = " | ".join(question.answers) if question.answers else "(unanswerable: 'unknown' is right)"
        print(format_run(question.question, run, passage_chars=100))
        print(f"Gold:     {gold}\n")
    return 0


SERVER_PARALLEL_QUESTIONS = 4  # `eval --parallel-questions` default for openai and ollama


def _parallel_questions(args: argparse.Namespace, llm: str) -> int:
    """`--parallel-questions`, else the deprecated `--concurrency`, else the default for `llm`."""
    if args.concurrency is not None:
        warn_deprecated("--concurrency", "--parallel-questions")
    return args.parallel_questions or args.concurrency or (1 if llm == "local" else SERVER_PARALLEL_QUESTIONS)


def _target_fallback(args: argparse.Namespace) -> float | None:
    """`--target-fallback`, else the deprecated `--target-escalation`."""
    if args.target_escalation is not None:
        warn_deprecated("--target-escalation", "--target-fallback")
    return args.target_fallback if args.target_fallback is not None else args.target_escalation


def _eval_retriever_factory(config: BackendConfig, documents: list[Any]) -> Any:
    """`eval`'s retrievers: over a new in-memory store of the passages, or the Elasticsearch index as it is."""
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from haystack_fusion.backends import document_store, write_documents

    if config.store == "memory":
        store = InMemoryDocumentStore()
        write_documents(config, store, documents)
    else:
        check_document_store(config)
        store = document_store(config)
    return lambda: backend_retriever(config, store)


def cmd_eval(args: argparse.Namespace) -> int:
    """`haystack-fusion eval`."""
    from haystack_fusion.evaluation.datasets import load_dataset
    from haystack_fusion.evaluation.passages import PassageSetting
    from haystack_fusion.evaluation.records import RESULTS_FILE, read_failures, read_run_manifest, write_run_manifest
    from haystack_fusion.evaluation.runner import BatchStoppedError, EvalConfig, Evaluator

    dataset = load_dataset(args.dataset, corpus=args.corpus, cache_dir=args.cache_dir).only(args.questions)
    dataset = dataset.sample(args.sample, seed=args.seed).limit(args.limit)
    backends = _backends(args)
    config = EvalConfig(
        strategies=[name.strip() for name in args.strategies.split(",") if name.strip()],
        top_ks=[int(k) for k in str(args.top_k).split(",")],
        setting=PassageSetting(gold_passage=args.gold_passage, noise_ratio=args.noise_ratio, seed=args.seed),
        parallel_questions=_parallel_questions(args, backends.llm),
        max_concurrency=args.max_concurrency,
        max_calls_in_flight=args.max_calls_in_flight,
        closed_book_filter=args.closed_book_filter,
        strategy_options=_strategy_options(args, backends.llm),
    )
    evaluator = Evaluator(
        dataset,
        config,
        args.out,
        retriever_factory=_eval_retriever_factory(backends, dataset.documents),
        generator_factory=lambda: backend_chat_generator(backends),
        fallback_generator_factory=partial(backend_chat_generator, fallback)
        if (fallback := fallback_config(backends))
        else None,
    )
    sample = f", stratified sample of {args.sample} (seed {args.seed})" if args.sample else ""
    title = (
        f"{dataset.name}: {len(dataset.questions)} questions{sample}; {backends.retrieval_label()}, "
        f"{config.setting.label()}; LLM: {backends.llms_label()}"
        + (", closed-book filtered" if config.closed_book_filter else "")
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runtime = llama_cpp_runtime() if backends.llm == "local" else None
    manifest: dict[str, Any] = {"title": title, "dataset": str(args.dataset), "command": getattr(args, "argv", None),
                                "runtime": runtime, "strategy_options": config.strategy_options,
                                "prices": dict(args.price or [])}  # fmt: skip
    write_run_manifest(args.out, **manifest)
    try:
        records = evaluator.run()
    except BatchStoppedError as error:
        message = failed_calls_message(error.failures, error.calls, backends)
        print(f"haystack-fusion: {message} ({error})", file=sys.stderr)
        return 1
    finally:
        if evaluator.notes:
            write_run_manifest(args.out, **manifest, notes=evaluator.notes)
    failures = read_failures(Path(args.out) / RESULTS_FILE)
    if records or not failures:  # every question failed: no report, the failures below say why
        kept = read_run_manifest(args.out)
        _write_report(records, args.out, title=title, dataset=dataset, args=args, notes=kept.get("notes") or [],
                      prices=kept.get("prices") or {})  # fmt: skip
    if args.export_notes:
        from haystack_fusion.evaluation.export import export_notes

        count = export_notes(
            args.out,
            dataset,
            args.export_notes,
            correct_only=args.export_correct_only,
            allow_parametric_knowledge=args.parametric_knowledge == "on",
        )
        print(f"Wrote {count} Chain-of-Note training examples to {args.export_notes}")
    if failures:
        queued = any(QUEUED_TIMEOUT_ADVICE in (failure.error or "") for failure in failures)
        slower = " with --max-calls-in-flight 1 (and a --timeout that covers one call)" if queued else ""
        again = f"Run the same command again{slower} to retry them, and only them"
        print(
            f"haystack-fusion: {len(failures)} question records failed (not in the report; each says what "
            f"failed in {Path(args.out) / 'results.jsonl'}), the first: {failures[0].strategy} top-{failures[0].top_k} "
            f"{failures[0].question_id}: {failures[0].error}. {again}",
            file=sys.stderr,
        )
        return EXIT_FAILED_QUESTIONS
    return 0


def _write_report(
    records: list[Any],
    out: str,
    *,
    title: str,
    dataset: Any,
    args: argparse.Namespace,
    notes: list[str],
    prices: dict[str, Any],
    runs: list[str] | None = None,
) -> None:
    """Write and print the report of `eval` and `report` (`--price` over the runs' prices)."""
    from haystack_fusion.evaluation.report import write_report

    sas_scores = None
    if args.sas:
        from haystack_fusion.evaluation.haystack_eval import records_sas

        sas_scores = records_sas(records, dataset)
    prices = {**prices, **dict(args.price or [])}
    write_report(records, out, title=title, baseline=args.baseline, sas=sas_scores, notes=notes, runs=runs,
                 prices={model: (float(price[0]), float(price[1])) for model, price in prices.items()},
                 target_accuracy=args.target_accuracy, target_fallback=_target_fallback(args))  # fmt: skip
    print((Path(out) / "results.md").read_text(encoding="utf-8"))


def cmd_report(args: argparse.Namespace) -> int:
    """`haystack-fusion report`."""
    from haystack_fusion.evaluation.datasets import load_dataset
    from haystack_fusion.evaluation.records import RESULTS_FILE, read_records, read_run_manifest
    from haystack_fusion.evaluation.runner import rescore
    from haystack_fusion.evaluation.view import with_model

    manifests = [read_run_manifest(run) for run in args.runs]
    folders = [read_records(Path(run) / RESULTS_FILE) for run in args.runs]
    folders = [with_model(f, m["model"]) if m.get("model") else f for f, m in zip(folders, manifests, strict=True)]
    records = [record for folder in folders for record in folder]
    if not records:
        raise FileNotFoundError(f"No {RESULTS_FILE} records in {', '.join(args.runs)}")
    manifest = manifests[0]
    source = args.dataset or manifest.get("dataset")
    dataset = None
    if source:
        dataset = load_dataset(source, corpus=args.corpus, cache_dir=args.cache_dir)
        records = rescore(records, dataset)
    elif args.sas:
        raise ValueError("--sas needs the dataset's gold answers: pass --dataset")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    title = args.title or manifest.get("title", "")
    notes = [note for m in manifests for note in m.get("notes") or []]
    prices = {model: price for m in manifests for model, price in (m.get("prices") or {}).items()}
    _write_report(records, args.out, title=title, dataset=dataset, args=args, notes=list(dict.fromkeys(notes)),
                  prices=prices, runs=_run_labels(args.runs, folders))  # fmt: skip
    return 0


def _run_labels(runs: list[str], folders: list[list[Any]]) -> list[str] | None:
    """A run label per record (its folder's name, or path) when a run's records are in several folders, else None."""
    seen: dict[tuple[str, int, str], int] = {}
    for index, folder in enumerate(folders):
        for key in {(r.strategy, r.top_k, r.setting) for r in folder}:
            if seen.setdefault(key, index) != index:
                names = [Path(run).name for run in runs]
                names = names if len(set(names)) == len(names) else list(runs)
                return [names[i] for i, folder in enumerate(folders) for _ in folder]
    return None


def cmd_pipelines(args: argparse.Namespace) -> int:
    """`haystack-fusion pipelines`."""
    from haystack_fusion.serving.yaml import YAML_SUBDIR, backend_name, generate

    config = BackendConfig(
        store=args.document_store,
        retriever=args.retriever,
        llm=args.llm,
        fallback_llm=args.fallback_llm,
        index_path=args.store,
        elasticsearch_url=args.es_url,
        elasticsearch_index=args.es_index,
    )
    written = generate(args.out, config, **({"speculative": True} if args.speculative else {}))
    wrappers = sum(1 for path in written if path.parent.name != YAML_SUBDIR)
    print(
        f"Wrote {wrappers} wrapper folders and {len(written) - wrappers} YAML pipelines on {backend_name(config)} "
        f"({YAML_SUBDIR}/) to {args.out}"
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """`haystack-fusion serve`."""
    try:
        from hayhooks.server.exceptions import PipelineModeError, PipelineModuleLoadError

        from haystack_fusion.backends.checks import BackendSetupError
        from haystack_fusion.serving.app import serve
    except ImportError:
        raise ImportError("`serve` needs the `serve` extra: pip install 'haystack-fusion[serve]'") from None
    try:
        serve(
            args.strategy,
            **{name: getattr(args, name) for name in ("host", "port", "pipelines_dir", "with_chainlit", "mcp")},
        )
    except (BackendSetupError, PipelineModeError, PipelineModuleLoadError) as error:
        print(f"haystack-fusion: {error}", file=sys.stderr)
        return 1
    return 0


CACHE_DIR_HELP = "where downloads are cached (default: ~/.cache/haystack_fusion)"
BACKEND_CHOICES = {
    "--document-store": ["memory", "elasticsearch"],
    "--retriever": ["bm25", "dense", "hybrid"],
    "--llm": ["local", "openai", "ollama"],
    "--fallback-llm": ["local", "openai", "ollama"],
}
Option = tuple[str, dict[str, Any]]


def _store_options(demo: bool = False) -> list[Option]:
    """The store options (the demo's own store and index)."""
    es_index = DEMO_ES_INDEX if demo else BackendConfig.elasticsearch_index
    store: dict[str, Any] = {"help": f"saved in-memory index file (default: ${STORE_VARIABLE} or {DEFAULT_STORE})"}
    if demo:
        store = {
            "default": str(DEMO_STORE),
            "help": f"saved in-memory index file the demo writes (default: {DEMO_STORE}; never the `index` "
            f"command's ${STORE_VARIABLE} or {DEFAULT_STORE}, so an index you built is kept)",
        }
    return [
        ("--store", store),
        ("--document-store", {"default": "memory", "help": "where passages live (default: memory; elasticsearch at "
                              "$ELASTICSEARCH_URL, key from $ELASTIC_API_KEY)"}),
        ("--es-index", {"default": es_index, "help": f"Elasticsearch index (default: {es_index})"}),
        ("--retriever", {"default": "bm25", "help": "bm25 (default), dense (packaged MiniLM embeddings) or hybrid "
                         "(both, reciprocal rank fusion); index with the same choice, so passages get embeddings"}),
        ("--embedder", {"default": "packaged", "choices": ["packaged", "openai"], "help": "embeddings for "
                        "dense/hybrid: packaged all-MiniLM-L6-v2 (default) or OpenAI ($OPENAI_API_KEY)"}),
    ]  # fmt: skip


LLM_OPTIONS: list[Option] = [
    ("--llm", {"default": "local", "help": "local (embedded model, default), openai ($OPENAI_API_KEY; --api-base-url "
               "for any OpenAI-compatible server) or ollama ($OLLAMA_HOST)"}),
    ("--model", {"help": "the LLM's model name (default: gpt-4o-mini for openai, qwen3:0.6b for ollama)"}),
    ("--api-base-url", {"help": "an OpenAI-compatible server's URL (default: $OPENAI_BASE_URL or OpenAI)"}),
    ("--timeout", {"type": float, "help": "seconds before an openai or ollama call gives up (default: the client's "
                   "own, 30 for openai or $OPENAI_TIMEOUT, 120 for ollama)"}),
    ("--max-tokens", {"type": int, "help": "completion budget of a call in tokens (default: the LLM's own; 128 for "
                      "the embedded model)"}),
    ("--max-retries", {"type": int, "help": "retries of a failed openai call, by the openai client (default: its "
                       "own)"}),
    ("--logprobs", {"action": "store_true", "help": "ask an openai server for token log-probabilities, so answers "
                    "carry a confidence (the embedded model always returns them; ollama returns none)"}),
    ("--fallback-llm", {"help": "the LLM of every round after the first of concat_pf, pf_concat and cascade: a "
                        "strong model that answers only the questions the first passes on (default: --llm)"}),
    ("--fallback-model", {"help": "its model name (default: as --model's)"}),
    ("--fallback-api-base-url", {"help": "its OpenAI-compatible server's URL (default: $OPENAI_BASE_URL or OpenAI)"}),
    ("--llama-log", {"action": "store_true", "help": "print the embedded model's llama.cpp log lines (model "
                     "loading, cache sizes) on stderr; without it, only llama.cpp's errors (also "
                     "$HAYSTACK_FUSION_LLAMA_LOG=1)"}),
]  # fmt: skip

SPECULATIVE_OPTION: Option = ("--speculative", {"action": "store_true", "help": "concat_pf and cascade start "
                               "post-fusion's k calls beside concatenation's and cancel them when its answer holds: "
                               "less latency on a server that runs calls in parallel, the cancelled calls' tokens "
                               "paid (also $HAYSTACK_FUSION_SPECULATIVE=1; ignored by other strategies)"})  # fmt: skip

STRATEGY_OPTIONS: list[Option] = [
    ("--num-candidates", {"type": int, "default": 2, "help": "SuRe's answer candidates K (default: 2)"}),
    ("--candidate-prompt", {"choices": ["few-shot", "zero-shot"], "help": "SuRe's candidate prompt: Listing 13 "
                            "(few-shot) or Listing 6 (zero-shot); default: few-shot for the embedded model, a base "
                            "model that continues text, zero-shot for chat models"}),
    ("--parametric-knowledge", {"default": "on", "choices": ["on", "off"], "help": "Chain-of-Note: answer from the "
                                "model's own knowledge when no passage is relevant (on, the paper's step 5, default) "
                                'or say "unknown" (off)'}),
    ("--note-max-tokens", {"type": int, "help": "Chain-of-Note: completion budget of a call (default: 400 for the "
                           "embedded model, the --max-tokens of chat models)"}),
    ("--min-confidence", {"type": float, "help": "tau: concat_pf and cascade fall back to post-fusion when the "
                          "concatenation answer's confidence is below it (default: off for concat_pf, as in the "
                          f"paper; {CASCADE_MIN_CONFIDENCE} for cascade)"}),
    ("--confidence", {"choices": ["logprobs", "agreement", "none"], "help": "what concat_pf and cascade compare "
                      "with --min-confidence: token log-probabilities (logprobs, default), the share of "
                      "--agreement-samples sampled answers equal to the first (agreement: m extra calls per question, "
                      "for backends without log-probabilities) or nothing (none: only unknown falls back)"}),
    ("--agreement-samples", {"type": int, "help": "m, the sampled calls of --confidence agreement (default: 4)"}),
    ("--agreement-temperature", {"type": float, "help": "their temperature (default: 0.7)"}),
    ("--min-vote-share", {"type": float, "help": "s: cascade verifies a post-fusion vote whose winner has a smaller "
                          f"share of the votes (default: {CASCADE_MIN_VOTE_SHARE})"}),
    ("--verifier-scoring", {"choices": ["text", "probability"], "help": "SuRe's validity and ranking from the reply's "
                            "words (text, as in the paper) or from token probabilities (default: text for the sure "
                            "strategies, probability for cascade)"}),
    SPECULATIVE_OPTION,
]  # fmt: skip


def _price(text: str) -> tuple[str, tuple[float, float]]:
    """`--price MODEL=IN,OUT`; an argparse error for a bad value."""
    from haystack_fusion.evaluation.view import parse_price

    try:
        return parse_price(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


REPORT_OPTIONS: list[Option] = [
    ("--baseline", {"help": "strategy the others are compared with: paired bootstrap CI of the EM and F1 difference "
                    "over the same questions (default: concatenation when it ran)"}),
    ("--sas", {"action": "store_true", "help": "add semantic answer similarity (Haystack's SASEvaluator, packaged "
               "all-MiniLM-L6-v2; `dense` extra)"}),
    ("--price", {"action": "append", "type": _price, "metavar": "MODEL=IN,OUT", "help": "US dollars per million "
                 "input and output tokens of a model, e.g. gpt-4o-mini=0.15,0.60 (repeatable): the report's cost per "
                 "question and accuracy-vs-cost chart. `eval` keeps them in run.json for `report`; `report --price` "
                 "overrides them (default: none, cost unknown)"}),
    ("--target-accuracy", {"type": float, "metavar": "PERCENT", "help": "calibration: the cheapest tau whose "
                           "replayed SQuAD 2.0 EM reaches PERCENT (0-100) (default: the most accurate tau)"}),
    ("--target-fallback", {"type": float, "metavar": "PERCENT", "help": "calibration: the most accurate tau that "
                           "passes at most PERCENT (0-100) of the questions on to the fallback rounds (default: "
                           "none)"}),
    ("--target-escalation", {"type": float, "metavar": "PERCENT", "help": "deprecated: the old name of "
                             "--target-fallback, with its default"}),
]  # fmt: skip


def _answer_options(default_strategy: str) -> list[Option]:
    return [
        ("--strategy", {"default": default_strategy, "choices": list(STRATEGIES), "metavar": "NAME", "help": "the "
                        f"strategy: %(choices)s (default: {default_strategy}; `haystack-fusion strategies` tells what "
                        "each does)"}),
        ("--top-k", {"type": int, "default": 5, "help": "passages to retrieve (default: 5)"}),
        ("--max-concurrency", {"type": int, "help": MAX_CONCURRENCY_HELP}),
        *STRATEGY_OPTIONS,
    ]  # fmt: skip


def _add(sub: argparse.ArgumentParser, *groups: list[Option]) -> None:
    """Add each option of `groups` to `sub`."""
    for group in groups:
        for flag, kwargs in group:
            choices: dict[str, Any] = {"choices": BACKEND_CHOICES[flag]} if flag in BACKEND_CHOICES else {}
            sub.add_argument(flag, **choices, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `haystack-fusion` command."""
    parser = argparse.ArgumentParser(
        prog="haystack-fusion",
        description="Combine retrieved passages with an LLM (Liu et al., Kim et al., Yu et al.).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="index passages into a saved in-memory store")
    index.add_argument("source", help="SQuAD JSON (v1.1/v2.0), JSONL of passages, folder of .txt/.md, or URL")
    index.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    _add(index, _store_options())
    index.add_argument("--batch-size", type=int, default=64, help="passages per write (default: 64)")
    index.set_defaults(func=cmd_index)

    ask = commands.add_parser("ask", help="answer a question with a strategy")
    ask.add_argument("question", help="the question, answered from the indexed passages")
    _add(ask, _answer_options("concat_pf"))
    ask.add_argument("--json", action="store_true", help="print the answer, evidence and usage as JSON")
    _add(ask, _store_options(), LLM_OPTIONS)
    ask.set_defaults(func=cmd_ask)

    commands.add_parser("strategies", help="list the registered strategies").set_defaults(func=cmd_strategies)

    evaluate = commands.add_parser("eval", help="evaluate strategies on a dataset (EM, F1, %%Unk, %%NM, ...)")
    _add(evaluate, [
        ("--dataset", {"required": True, "help": "SQuAD JSON, or NQ-open JSONL with --corpus; path or URL"}),
        ("--corpus", {"help": "passage corpus for an NQ-open dataset: JSONL or DPR-style TSV (default: none; a SQuAD "
                      "file holds its passages)"}),
        ("--strategies", {"default": ",".join(STRATEGIES), "help": "comma-separated (default: all)"}),
        ("--top-k", {"default": "5", "help": "k, or a comma-separated sweep such as 5,10,20 (default: 5)"}),
        ("--limit", {"type": int, "help": "only the first N questions, after --questions and --sample (default: "
                     "all)"}),
        ("--sample", {"type": int, "help": "a fixed stratified random sample of N questions, half answerable and "
                      "half unanswerable (drawn with --seed): the same questions for every strategy and every run "
                      "(default: no sample, every question)"}),
        ("--questions", {"default": "all", "choices": ["all", "answerable", "unanswerable"], "help": "which "
                         "questions: all (default), answerable (noise robustness), unanswerable (reject rate)"}),
        ("--parallel-questions", {"type": int, "help": "questions answered at once (default: 1 for the embedded "
                                  "model, which runs one call at a time; "
                                  f"{SERVER_PARALLEL_QUESTIONS} for an openai or ollama server)"}),
        ("--concurrency", {"type": int, "help": "deprecated: the old name of --parallel-questions, with its default"}),
        ("--max-concurrency", {"type": int, "help": MAX_CONCURRENCY_HELP}),
        ("--max-calls-in-flight", {"type": int, "help": "LLM calls under way at once in the whole run, shared by "
                                   "the --parallel-questions questions and their rounds (default: "
                                   f"${MAX_CALLS_IN_FLIGHT_ENV}, else no limit): set it to what a rate-limited API "
                                   "allows, so a storm of 429s slows the run down instead of failing calls. Failed "
                                   "questions are recorded as failed, kept out of the report, and asked again by the "
                                   f"same command (exit status {EXIT_FAILED_QUESTIONS} while some remain)"}),
        ("--gold-passage", {"default": "none", "choices": ["none", "random", "first", "last"], "help": "the "
                            "question's gold passage in the top-k: none keeps retrieval as it is (default); random "
                            "puts it at a random position when retrieval missed it; first / last always put it there "
                            "(Liu et al. section 4.5)"}),
        ("--noise-ratio", {"type": float, "help": "share of irrelevant passages in the top-k, 0-1 (Yu et al. section "
                           "3.1.1; default: none, the top-k as retrieved)"}),
        ("--closed-book-filter", {"action": "store_true", "help": "drop questions answered with no context"}),
        ("--seed", {"type": int, "default": 0, "help": "seed of --sample and of the settings' random choices "
                    "(default: 0)"}),
        ("--out", {"required": True, "help": "output folder; re-running with it resumes"}),
        ("--cache-dir", {"help": CACHE_DIR_HELP}),
    ], STRATEGY_OPTIONS, _store_options(), LLM_OPTIONS, REPORT_OPTIONS, [
        ("--export-notes", {"metavar": "PATH", "help": "write the Chain-of-Note records as chat fine-tuning JSONL "
                            "(Yu et al. section 2.3.2; default: none written)"}),
        ("--export-correct-only", {"action": "store_true", "help": "with --export-notes: only correctly answered "
                                   "questions"}),
    ])  # fmt: skip
    evaluate.set_defaults(func=cmd_eval)

    report = commands.add_parser(
        "report", help="rebuild the tables and charts of `eval` output folders from their records and the dataset"
    )
    report.add_argument("runs", nargs="+", help="`eval --out` folders (e.g. one per noise ratio)")
    _add(report, [
        ("--out", {"required": True, "help": "where results.md, summary.json and the charts go"}),
        ("--title", {"default": "", "help": "heading of the table (default: the first run's)"}),
        ("--dataset", {"help": "the dataset file the runs answered, to rescore them (default: the one the run "
                       "names)"}),
        ("--corpus", {"help": "passage corpus for an NQ-open dataset (default: none; a SQuAD file holds its "
                      "passages)"}),
        ("--cache-dir", {"help": CACHE_DIR_HELP}),
    ], REPORT_OPTIONS)  # fmt: skip
    report.set_defaults(func=cmd_report)

    pipelines = commands.add_parser(
        "pipelines",
        help="write a Hayhooks wrapper per strategy and every strategy's YAML on one backend (in yaml/)",
        description="Write a Hayhooks wrapper folder per strategy and every strategy's YAML pipeline on the backend "
        "the flags name, in yaml/<strategy>__<store>_<retriever>_<llm>.yml. The defaults write what the repository's "
        "pipelines/ holds: the embedded model over the saved in-memory index (memory_bm25_local).",
    )
    es_url, es_index = BackendConfig.elasticsearch_url, BackendConfig.elasticsearch_index
    _add(pipelines, [
        ("--out", {"default": "pipelines", "help": "output folder (default: ./pipelines, relative to the working "
                   "directory)"}),
        ("--document-store", {"default": "memory", "help": "where the pipelines find the passages: memory (the "
                              "saved index of --store, default) or elasticsearch (--es-url, --es-index)"}),
        ("--retriever", {"default": "bm25", "help": "bm25 (default), dense or hybrid (both, reciprocal rank fusion) "
                         "on the packaged MiniLM embeddings; dense and hybrid need --document-store elasticsearch"}),
        ("--llm", {"default": "local", "help": "local (the embedded model, default), openai (gpt-4o-mini; "
                   "$OPENAI_API_KEY and $OPENAI_BASE_URL read when the pipeline runs) or ollama (qwen3:0.6b at "
                   "http://localhost:11434); edit a file's `model:` for another"}),
        ("--fallback-llm", {"help": "the LLM of the fallback rounds of concat_pf, pf_concat and cascade, as --llm "
                            "(default: --llm for every round); the file names end in _to_<it>"}),
        ("--es-url", {"default": es_url, "help": f"Elasticsearch hosts written into the YAML (default: {es_url})"}),
        ("--es-index", {"default": es_index, "help": "Elasticsearch index written into the YAML, the one `index "
                        f"--document-store elasticsearch --es-index NAME` filled (default: {es_index})"}),
        ("--store", {"default": DEFAULT_INDEX_PATH, "help": "saved in-memory index written into the YAML; ~ is "
                     f"expanded where the pipeline runs (default: {DEFAULT_INDEX_PATH})"}),
        SPECULATIVE_OPTION,
    ])  # fmt: skip
    pipelines.set_defaults(func=cmd_pipelines)

    serve = commands.add_parser(
        "serve",
        help="serve strategies over HTTP (run routes, OpenAI-compatible chat, optional chat UI) or MCP",
        description="Serve strategies with Hayhooks on the backend the environment names (docs/serving.md). Nothing "
        "deploys at run time; only the origins of $HAYSTACK_FUSION_CORS_ORIGINS may call it from web pages; with "
        "$HAYSTACK_FUSION_API_KEY set, every route but GET /status needs `Authorization: Bearer <key>`.",
    )
    _add(serve, [
        ("--strategy", {"action": "append", "choices": sorted(STRATEGIES), "metavar": "NAME", "help": "a strategy to "
                        "serve, repeatable (default: all of them)"}),
        ("--pipelines-dir", {"help": "serve the wrapper folders and YAML pipelines of this folder instead of "
                             "--strategy (default: none, the strategies)"}),
        ("--host", {"default": "127.0.0.1", "help": "the address to bind (default: 127.0.0.1)"}),
        ("--port", {"type": int, "help": "the port (default: 1416; 1417 with --mcp)"}),
        ("--with-chainlit", {"action": "store_true", "help": "mount Hayhooks' chat UI at /chat"}),
        ("--mcp", {"action": "store_true", "help": "serve the strategies as MCP tools (/mcp, /sse) instead"}),
    ])  # fmt: skip
    serve.set_defaults(func=cmd_serve)

    demo = commands.add_parser(
        "demo",
        help=f"index SQuAD 2.0 into the demo's own store ({DEMO_STORE}) and answer a handful of its questions",
        description=f"Index a SQuAD 2.0 file (--dataset, else ${SQUAD_VARIABLE}, else the official dev set, downloaded "
        f"once) into the demo's own store ({DEMO_STORE}, or --store): never the `index` command's, so an index you "
        "built is kept. Then answer a handful of its questions, about half of them unanswerable.",
    )
    _add(demo, [
        ("--dataset", {"help": f"path or URL of a SQuAD JSON file (default: ${SQUAD_VARIABLE}, else the official "
                       "SQuAD 2.0 dev set, downloaded once into --cache-dir and checksum-verified)"}),
        ("--questions", {"type": int, "default": 5, "help": "how many questions to answer (default: 5)"}),
        ("--cache-dir", {"help": CACHE_DIR_HELP}),
    ], _answer_options("concat_pf"), _store_options(demo=True), LLM_OPTIONS)  # fmt: skip
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `haystack-fusion`: exit status 0, 2 for bad input, 1 for an unusable backend (a line on
    stderr)."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    top_k = getattr(args, "top_k", None)
    if isinstance(top_k, int) and top_k < 1:
        print("haystack-fusion: --top-k must be at least 1", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except Exception as error:
        message = backend_error_message(error, _error_config(args))
        if message is not None:
            print(f"haystack-fusion: {message}", file=sys.stderr)
            return 1
        if not isinstance(error, (ValueError, FileNotFoundError, ImportError)):
            raise
        print(f"haystack-fusion: {error}", file=sys.stderr)
        return 2


def _error_config(args: argparse.Namespace) -> BackendConfig:
    """The backends a failed command used (the environment's alone when its flags fail)."""
    try:
        return _backends(args)
    except (AttributeError, ValueError):
        try:
            return BackendConfig.from_env()
        except ValueError:
            return BackendConfig()


if __name__ == "__main__":
    sys.exit(main())
