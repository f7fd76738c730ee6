"""Term-frequency text similarity, written once and shared.

Used by MCP server discovery, history search and compression, convergence detection and the
skills TF-IDF fallback. robot_lab gets this from the ``classifier`` gem (``String#word_hash``
and ``Classifier::TFIDF``); robot-lab implements it here in plain Python (a few dict
operations; no numpy/scikit-learn needed for texts the size of chat messages).

Vectors are sparse ``dict[str, float]`` keyed by stem. :func:`word_hash` follows the gem's
``clean_word_hash``: drop characters that are neither word characters nor whitespace, split
on whitespace, lower-case, skip the gem's stop words and words of two letters or fewer, and
stem with the Porter stemmer (:mod:`robot_lab.text.stemmer`). Two deliberate
differences: punctuation tokens (the gem's ``word_hash_for_symbols``) are not counted, since
a shared ``.`` or ``?`` would make unrelated sentences look alike; and word characters are
Unicode (``café`` stays ``café``; Ruby's ASCII ``\\w`` turns it into ``caf``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping

from robot_lab.text.stemmer import stem

Vector = dict[str, float]

# The classifier gem's CORPUS_SKIP_WORDS, verbatim.
STOP_WORDS: frozenset[str] = frozenset(
    """a again all along are also an and as at but by came can cant couldnt did didn didnt do
    doesnt dont ever first from have her here him how i if in into is isnt it itll just last
    least like most my new no not now of on or should sinc so some th than this that the their
    then those to told too true try until url us were when whether while with within yes you
    youll""".split()
)

_NON_WORD = re.compile(r"[^\w\s]")


def tokenize(text: str | None) -> list[str]:
    """Stemmed, stop-word-free tokens of ``text`` in order (duplicates kept)."""
    if not text:
        return []
    tokens = []
    for word in _NON_WORD.sub("", text).split():
        word = word.lower()
        if len(word) > 2 and word not in STOP_WORDS:
            tokens.append(stem(word))
    return tokens


def word_hash(text: str | None) -> dict[str, int]:
    """Term frequencies of ``text`` (the Ruby gem's ``String#word_hash``)."""
    return dict(Counter(tokenize(text)))


def tf_vector(text: str | None) -> Vector:
    """The L2-normalized term-frequency vector of ``text`` ({} when it has no terms)."""
    return l2_normalize(word_hash(text))


def dot(vec_a: Mapping[str, float], vec_b: Mapping[str, float]) -> float:
    """Dot product over shared keys (iterates the smaller vector)."""
    if len(vec_a) > len(vec_b):
        vec_a, vec_b = vec_b, vec_a
    return float(sum(value * vec_b[key] for key, value in vec_a.items() if key in vec_b))


def l2_normalize(vec: Mapping[str, float]) -> Vector:
    """``vec`` scaled to unit length; ``{}`` when its magnitude is zero."""
    magnitude = math.sqrt(sum(float(v) * float(v) for v in vec.values()))
    if magnitude == 0.0:
        return {}
    return {key: float(value) / magnitude for key, value in vec.items()}


def cosine_similarity(vec_a: Mapping[str, float], vec_b: Mapping[str, float]) -> float:
    """Cosine of two L2-normalized vectors: their dot product, clamped to <= 1.0
    (float noise), and 0.0 when either is empty."""
    if not vec_a or not vec_b:
        return 0.0
    return min(dot(vec_a, vec_b), 1.0)


def tf_cosine_similarity(text_a: str | None, text_b: str | None) -> float:
    """Similarity of two texts from stemmed term frequencies, no IDF.

    Needs no reference corpus, which makes it reliable for comparing just two texts
    (IDF over a two-document corpus zeroes exactly the terms they share).
    """
    return cosine_similarity(tf_vector(text_a), tf_vector(text_b))


def mean_vector(vectors: Iterable[Mapping[str, float]]) -> Vector:
    """Element-wise mean of sparse vectors ({} for none)."""
    total: dict[str, float] = {}
    count = 0
    for vec in vectors:
        count += 1
        for key, value in vec.items():
            total[key] = total.get(key, 0.0) + float(value)
    if count == 0:
        return {}
    return {key: value / count for key, value in total.items()}


class TfidfModel:
    """TF-IDF over a fitted corpus (the Ruby gem's ``Classifier::TFIDF(min_df: 1)``).

    ``idf(t) = ln((1 + N) / (1 + df(t))) + 1`` (smoothed, so a term found in every document
    still counts a little); :meth:`transform` returns an L2-normalized vector over the fitted
    vocabulary and ``{}`` when the text has no known term.
    """

    def __init__(self) -> None:
        self.idf: dict[str, float] = {}
        self.document_count = 0

    def fit(self, corpus: Iterable[str]) -> TfidfModel:
        documents = [set(tokenize(doc)) for doc in corpus]
        self.document_count = len(documents)
        df: Counter[str] = Counter()
        for terms in documents:
            df.update(terms)
        n = self.document_count
        self.idf = {term: math.log((1 + n) / (1 + count)) + 1.0 for term, count in df.items()}
        return self

    @property
    def vocabulary(self) -> frozenset[str]:
        return frozenset(self.idf)

    def transform(self, text: str | None) -> Vector:
        counts = word_hash(text)
        return l2_normalize({t: c * self.idf[t] for t, c in counts.items() if t in self.idf})


def fit(corpus: Iterable[str]) -> TfidfModel:
    """Fit a TF-IDF model on ``corpus`` (the Ruby gem's ``TextAnalysis.fit``)."""
    return TfidfModel().fit(corpus)


def transform(model: TfidfModel, text: str | None) -> Vector:
    """The L2-normalized TF-IDF vector of ``text`` under ``model``."""
    return model.transform(text)


__all__ = [
    "STOP_WORDS",
    "TfidfModel",
    "Vector",
    "cosine_similarity",
    "dot",
    "fit",
    "l2_normalize",
    "mean_vector",
    "tf_cosine_similarity",
    "tf_vector",
    "tokenize",
    "transform",
    "word_hash",
]
