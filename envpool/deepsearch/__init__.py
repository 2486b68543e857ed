"""Deep Search: multi-hop question answering over a generated fictional world with a search tool.

The world (entities, relations, passages, 1- to 4-hop questions) is in `world`, the search
backends (BM25, a user's HTTP service) in `retriever`, the environment in `env`.
"""

from __future__ import annotations

from horizonrl.envpool.deepsearch.env import (
    SYSTEM_PROMPT,
    DeepSearchEnv,
    format_action,
    parse_action,
    random_action,
    vocabulary,
)
from horizonrl.envpool.deepsearch.retriever import (
    BM25Retriever,
    HTTPRetriever,
    Passage,
    Retriever,
    RetrieverError,
)
from horizonrl.envpool.deepsearch.world import Question, World, build_world

__all__ = [
    "SYSTEM_PROMPT",
    "BM25Retriever",
    "DeepSearchEnv",
    "HTTPRetriever",
    "Passage",
    "Question",
    "Retriever",
    "RetrieverError",
    "World",
    "build_world",
    "format_action",
    "parse_action",
    "random_action",
    "vocabulary",
]
