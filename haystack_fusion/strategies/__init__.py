"""
The strategies: each one's settings, pipeline, stages and sources, and how its runs read.

- `config`: `StrategyConfig` (what every builder takes), `Strategy` and `Stage` (a registry entry and its rounds),
  the papers it cites;
- `registry`: one pipeline builder per strategy, `STRATEGIES` (name -> `Strategy`, the single source of truth),
  `get_strategy`, `build_pipeline`, `strategy_of` (the strategy a pipeline's metadata names);
- `run`: `run_strategy`, `strategy_run` and `StrategyRun` (answer, evidence, usage, failures, stages);
- `answerer`: `FusionAnswerer`, any strategy as one SuperComponent.
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
from haystack_fusion.strategies.registry import (
    CASCADE_MIN_CONFIDENCE,
    CASCADE_MIN_VOTE_SHARE,
    STRATEGIES,
    build_pipeline,
    get_strategy,
    strategy_of,
)
from haystack_fusion.strategies.run import StrategyRun, run_strategy, strategy_run

__all__ = [
    "CASCADE_MIN_CONFIDENCE",
    "CASCADE_MIN_VOTE_SHARE",
    "PAPERS",
    "RETRIEVER",
    "SPLIT_ROUTER",
    "STRATEGIES",
    "FusionAnswerer",
    "Stage",
    "StageKind",
    "Strategy",
    "StrategyConfig",
    "StrategyRun",
    "build_pipeline",
    "cite",
    "get_strategy",
    "run_strategy",
    "strategy_of",
    "strategy_run",
]
