"""
The strategies: each one's settings, pipeline, stages and sources, and how its runs read.

- `config`: `StrategyConfig` (what every builder takes), `Strategy` and `Stage` (a registry entry and its rounds),
  the papers it cites;
- `registry`: one pipeline builder per strategy, `STRATEGIES` (name -> `Strategy`, the single source of truth),
  `get_strategy`, `build_pipeline`, `strategy_of` (the strategy a pipeline's metadata names);
- `record`: `StrategyRun`, the typed record of a run (answer, `Evidence` per strategy family, `Usage` per model,
  failed calls);
- `run`: `run_strategy`, `strategy_run` (a `StrategyRun` from a pipeline's outputs), and a run as plain text
  (`chat_text`, `sources_text`, `evidence_line`, `passages`, `source_title`);
- `answerer`: `FusionAnswerer`, any strategy as one SuperComponent;
- `tool`: `strategy_tool`, a strategy over your retriever as one tool for a Haystack `Agent` (`tool_text`).
"""

from haystack_fusion.strategies.answerer import FusionAnswerer
from haystack_fusion.strategies.config import (
    PAPERS,
    RETRIEVER,
    SPLIT_ROUTER,
    Stage,
    StageKind,
    Strategy,
    StrategyConfig,
    cite,
)
from haystack_fusion.strategies.record import (
    Evidence,
    InvalidAnswer,
    Notes,
    StageResult,
    StrategyRun,
    SureEvidence,
    SureScore,
    Usage,
    Vote,
)
from haystack_fusion.strategies.registry import (
    CASCADE_MIN_CONFIDENCE,
    CASCADE_MIN_VOTE_SHARE,
    FALLBACK_STRATEGIES,
    STRATEGIES,
    build_pipeline,
    get_strategy,
    strategy_of,
    strategy_settings,
)
from haystack_fusion.strategies.run import (
    chat_text,
    cited_sources,
    evidence_line,
    passages,
    rounded,
    run_strategy,
    source_title,
    sources_text,
    strategy_run,
    supporting_ids,
)
from haystack_fusion.strategies.tool import strategy_tool, tool_text

__all__ = [
    "CASCADE_MIN_CONFIDENCE",
    "CASCADE_MIN_VOTE_SHARE",
    "FALLBACK_STRATEGIES",
    "PAPERS",
    "RETRIEVER",
    "SPLIT_ROUTER",
    "STRATEGIES",
    "Evidence",
    "FusionAnswerer",
    "InvalidAnswer",
    "Notes",
    "Stage",
    "StageKind",
    "StageResult",
    "Strategy",
    "StrategyConfig",
    "StrategyRun",
    "SureEvidence",
    "SureScore",
    "Usage",
    "Vote",
    "build_pipeline",
    "chat_text",
    "cite",
    "cited_sources",
    "evidence_line",
    "get_strategy",
    "passages",
    "rounded",
    "run_strategy",
    "source_title",
    "sources_text",
    "strategy_of",
    "strategy_run",
    "strategy_settings",
    "strategy_tool",
    "supporting_ids",
    "tool_text",
]
