"""Embedders for skill matching, and the description-vector cache.

An embedder has ``name`` (the model id: it picks the threshold and namespaces the cache),
``cacheable`` (vectors depend on the text alone, so they may be shared across processes),
``embed_query(text)`` and ``embed_passages(texts)``; vectors come back L2-normalised so a
cosine is a dot product.

* :class:`FastEmbedEmbedder` — the default (fastembed, imported lazily). Offline by
  default: ``local_files_only`` unless ``settings.skills.allow_model_download``, so a
  missing model fails in a second instead of retrying downloads for 40.
* :class:`TfidfEmbedder` — the lexical fallback used, with a warning, when the model cannot
  be loaded. IDF is fitted on the passages (skill descriptions), so it is not cacheable.
* :class:`FakeEmbedder` — deterministic hashed bag of words for unit tests.

:class:`EmbeddingCache` keeps description vectors in-process and, given a Redis client,
under ``<prefix>:skills:emb:<model>:<sha256(text)>`` (float32 bytes) so a fleet of workers
embeds each description once.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from robot_lab.connection import mget
from robot_lab.keys import default_keys
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings
from robot_lab.text.analysis import TfidfModel, tokenize

log = get_logger("robot_lab.skills.embedding")

@runtime_checkable
class Embedder(Protocol):
    name: str
    cacheable: bool

    def embed_query(self, text: str) -> np.ndarray: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim == 1:
        norm = float(np.linalg.norm(matrix))
        return matrix / norm if norm > 0 else matrix
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return matrix / norms


# --- fake ------------------------------------------------------------------------------------


class FakeEmbedder:
    """Deterministic, dependency-free: each stemmed word hashed into ``dim`` buckets.

    ``vectors`` overrides texts with fixed vectors; ``fail=True`` makes every call raise
    (to test that an embedding failure skips injection and the run goes on).
    """

    cacheable = True

    def __init__(self, dim: int = 256, *, vectors: dict[str, Sequence[float]] | None = None, name: str = "fake") -> None:
        self.dim = dim
        self.vectors = {k: np.asarray(v, dtype=np.float32) for k, v in (vectors or {}).items()}
        self.name = name
        self.fail = False
        self.calls = 0

    def _embed(self, text: str) -> np.ndarray:
        self.calls += 1
        if self.fail:
            raise RuntimeError("fake embedder told to fail")
        if text in self.vectors:
            return _normalise(self.vectors[text])
        vec = np.zeros(self.dim, dtype=np.float32)
        for word in tokenize(text):
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            vec[int.from_bytes(digest, "little") % self.dim] += 1.0
        return _normalise(vec)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed(text)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._embed(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


# --- TF-IDF -------------------------------------------------------------------------------------


class TfidfEmbedder:
    """Lexical fallback: :class:`robot_lab.text.analysis.TfidfModel` (the one TF-IDF of the
    package), fitted on the last passages embedded, as dense vectors over its vocabulary.

    Not cacheable across processes (a vector depends on the whole set of descriptions).
    """

    name = "tfidf"
    cacheable = False

    def __init__(self) -> None:
        self._model = TfidfModel()
        self._vocab: dict[str, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _dense(sparse: dict[str, float], vocab: dict[str, int]) -> np.ndarray:
        vec = np.zeros(len(vocab), dtype=np.float32)
        for term, value in sparse.items():
            vec[vocab[term]] = value
        return vec

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        model = TfidfModel().fit(texts)
        vocab = {term: i for i, term in enumerate(sorted(model.vocabulary))}
        with self._lock:
            self._model, self._vocab = model, vocab
        if not texts:
            return np.zeros((0, 0), np.float32)
        return np.stack([self._dense(model.transform(t), vocab) for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        with self._lock:
            model, vocab = self._model, self._vocab
        return self._dense(model.transform(text), vocab)


# --- fastembed ------------------------------------------------------------------------------------


def infer_model_name(path: str | None, configured: str, default: str) -> str:
    """When only a model folder is configured, guess its fastembed id from the folder name.

    ``all-MiniLM-L6-v2-onnx`` -> ``sentence-transformers/all-MiniLM-L6-v2``. An explicitly
    configured (non-default) model name always wins.
    """
    if not path or configured != default:
        return configured
    folder = Path(path).name.lower()
    try:
        from fastembed import TextEmbedding  # lazy: start-up time

        supported = [m["model"] for m in TextEmbedding.list_supported_models()]
    except Exception:
        return configured
    best = configured
    best_len = 0
    for model in supported:
        short = model.split("/")[-1].lower()
        if short in folder and len(short) > best_len:
            best, best_len = model, len(short)
    return best


@contextmanager
def _quiet_fastembed() -> Iterator[None]:
    """fastembed logs each failed download source at ERROR through loguru; we log one warning."""
    try:
        from loguru import logger  # lazy: start-up time
    except ImportError:  # pragma: no cover - fastembed depends on loguru
        yield
        return
    logger.disable("fastembed")
    try:
        yield
    finally:
        logger.enable("fastembed")


class FastEmbedEmbedder:
    """fastembed ``TextEmbedding``: query and passage embeddings (bge uses different prompts)."""

    cacheable = True

    def __init__(
        self,
        model_name: str = "BAAI/bge-small-en-v1.5",
        *,
        model_path: str | None = None,
        allow_download: bool = False,
        threads: int | None = None,
    ) -> None:
        from fastembed import TextEmbedding  # lazy: ~1 s import

        kwargs: dict[str, Any] = {"model_name": model_name, "threads": threads}
        if model_path:
            if not Path(model_path).is_dir():
                raise FileNotFoundError(f"embedding model folder {model_path} does not exist")
            kwargs["specific_model_path"] = str(model_path)
        if not allow_download:
            kwargs["local_files_only"] = True
        self.name = model_name
        self.model_path = model_path
        with _quiet_fastembed():
            self._model = TextEmbedding(**kwargs)
        self._lock = threading.Lock()  # onnxruntime sessions are thread-safe; the generator wrapper is not

    def embed_query(self, text: str) -> np.ndarray:
        with self._lock:
            vec = next(iter(self._model.query_embed([text])))
        return _normalise(vec)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), np.float32)
        with self._lock:
            vectors = list(self._model.passage_embed(list(texts)))
        return _normalise(np.stack(vectors))


_embedders: dict[tuple[str, str | None, str], Embedder] = {}
_embedders_lock = threading.Lock()


def load_embedder(settings: Any = None, *, quiet: bool = False) -> Embedder:
    """The configured embedder, loaded once per process; TF-IDF (with a warning) if it fails.

    The fallback embedder carries ``fallback_from`` (the model that did not load), so a
    command can say so in its own output; ``quiet`` leaves the log warning to such callers."""
    if settings is None:
        settings = get_settings()
    skills = getattr(settings, "skills", settings)
    kind = skills.embedder
    default_model = type(skills).model_fields["embedding_model"].default
    model_path = skills.embedding_model_path
    model = infer_model_name(model_path, skills.embedding_model, default_model) if kind == "fastembed" else "tfidf"
    key = (kind, model_path, model)
    with _embedders_lock:
        cached = _embedders.get(key)
        if cached is not None:
            return cached
        embedder: Embedder
        if kind == "tfidf":
            embedder = TfidfEmbedder()
        else:
            try:
                embedder = FastEmbedEmbedder(model, model_path=model_path, allow_download=skills.allow_model_download,
                                             threads=skills.embedding_threads)
            except Exception as exc:
                (log.info if quiet else log.warning)(
                    "skills.embedder_fallback",
                    model=model,
                    model_path=model_path,
                    error=f"{type(exc).__name__}: {str(exc)[:300]}",
                    note="skill matching falls back to lexical TF-IDF; set skills.embedding_model_path "
                         "to a local model folder (or skills.allow_model_download) for semantic matching",
                )
                embedder = TfidfEmbedder()
                embedder.fallback_from = model  # type: ignore[attr-defined]
        _embedders[key] = embedder
        return embedder


def reset_embedders() -> None:
    with _embedders_lock:
        _embedders.clear()


# --- cache ------------------------------------------------------------------------------------------


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """Passage vectors by (model, content hash): in-process, and in Redis when given a client.

    Redis is best effort: any Redis error is logged once and the cache carries on locally.
    """

    def __init__(self, redis: Any = None, *, keys: Any = None, ttl: int | None = 30 * 86_400,
                 max_local: int = 10_000) -> None:
        self.redis = redis
        if keys is None and redis is not None:
            keys = default_keys()
        self.keys = keys
        self.ttl = ttl
        self.max_local = max_local
        self._local: dict[tuple[str, str], np.ndarray] = {}
        self._lock = threading.Lock()
        self._redis_warned = False
        self.hits = {"local": 0, "redis": 0, "miss": 0}

    def _redis_failed(self, exc: Exception) -> None:
        if not self._redis_warned:
            self._redis_warned = True
            log.warning("skills.embedding_cache_redis_error", error=f"{type(exc).__name__}: {exc}")

    def get_many(self, model: str, texts: Sequence[str]) -> list[np.ndarray | None]:
        digests = [digest(t) for t in texts]
        with self._lock:
            found: list[np.ndarray | None] = [self._local.get((model, d)) for d in digests]
        self.hits["local"] += sum(v is not None for v in found)
        missing = [i for i, v in enumerate(found) if v is None]
        if missing and self.redis is not None:
            try:
                raws = mget(self.redis, [self.keys.skill_embedding(model, digests[i]) for i in missing])
            except Exception as exc:
                self._redis_failed(exc)
                raws = [None] * len(missing)
            fetched = {}
            for i, raw in zip(missing, raws):
                if raw:
                    vec = np.frombuffer(raw, dtype=np.float32).copy()
                    found[i] = vec
                    fetched[(model, digests[i])] = vec
            self.hits["redis"] += len(fetched)
            if fetched:
                with self._lock:
                    self._local.update(fetched)
        self.hits["miss"] += sum(v is None for v in found)
        return found

    def put_many(self, model: str, texts: Sequence[str], vectors: Sequence[np.ndarray]) -> None:
        items = {(model, digest(t)): np.asarray(v, dtype=np.float32) for t, v in zip(texts, vectors)}
        with self._lock:
            if len(self._local) + len(items) > self.max_local:
                self._local.clear()
            self._local.update(items)
        if self.redis is None or not items:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for (m, d), vec in items.items():
                pipe.set(self.keys.skill_embedding(m, d), vec.tobytes(), ex=self.ttl)
            pipe.execute()
        except Exception as exc:
            self._redis_failed(exc)

    def clear_local(self) -> None:
        with self._lock:
            self._local.clear()
