"""TextAnalysis: word_hash (stop words, short words, stemming), TF cosine, TF-IDF."""

from __future__ import annotations

import math

import pytest

from robot_lab.text import analysis as ta
from robot_lab.text.stemmer import stem


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("caresses", "caress"), ("ponies", "poni"), ("agreed", "agre"), ("hopping", "hop"),
        ("filing", "file"), ("happy", "happi"), ("relational", "relat"), ("conformabli", "conform"),
        ("analogousli", "analog"), ("hopefulness", "hope"), ("electrical", "electr"),
        ("adoption", "adopt"), ("controll", "control"), ("generous", "gener"),
        ("connections", "connect"), ("connecting", "connect"), ("it", "it"),
    ],
)
def test_porter_stemmer_matches_reference(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_stemmer_is_snowball_porter_without_the_c_departures() -> None:
    # The gem's C stemmer gives "assembl" / "methodolog"; snowball's Porter does not make
    # those two departures from the paper (docs/safety.md says why that is fine).
    assert stem("assembly") == "assembli"
    assert stem("methodology") == "methodologi"
    # Porter, not Porter2: "generous" -> "gener" as in the gem.
    assert stem("generous") == "gener"


def test_stemmer_is_thread_safe() -> None:
    import threading

    words = [f"connection{'s' * (i % 2)}" for i in range(2000)] + ["relational", "hopping"] * 500
    stem.cache_clear()
    results: list[list[str]] = []

    def work() -> None:
        results.append([stem(w) for w in words])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [stem(w) for w in words]
    assert all(r == expected for r in results)


def test_word_hash_drops_stop_words_short_words_and_punctuation() -> None:
    hashed = ta.word_hash("The connections, and THE connecting of it! Is it a URL? ok")
    assert hashed == {"connect": 2}
    assert ta.word_hash("") == {}
    assert ta.word_hash(None) == {}


def test_word_hash_keeps_unicode_words() -> None:
    assert ta.word_hash("Café crème") == {"café": 1, "crème": 1}


def test_l2_normalize_and_empty() -> None:
    vec = ta.l2_normalize({"a": 3, "b": 4})
    assert vec == pytest.approx({"a": 0.6, "b": 0.8})
    assert ta.l2_normalize({"a": 0}) == {}
    assert ta.l2_normalize({}) == {}


def test_cosine_similarity_clamped_and_zero_for_empty() -> None:
    # Float noise above 1 is clamped.
    assert ta.cosine_similarity({"a": 1.0000001}, {"a": 1.0000001}) == 1.0
    assert ta.cosine_similarity({}, {"a": 1.0}) == 0.0
    assert ta.cosine_similarity({"a": 1.0}, {}) == 0.0
    assert ta.dot({"a": 2.0, "b": 1.0}, {"b": 3.0, "c": 5.0}) == 3.0


def test_tf_cosine_similarity_ranks_related_text_higher() -> None:
    query = "install the imagemagick package with homebrew"
    brew = "brew: install, update and manage macOS packages via Homebrew"
    github = "github: repositories, issues, pull requests and code search"
    assert ta.tf_cosine_similarity(query, brew) > 0.3
    assert ta.tf_cosine_similarity(query, github) == 0.0
    assert ta.tf_cosine_similarity("same words here", "same words here") == pytest.approx(1.0)
    assert ta.tf_cosine_similarity("", "anything") == 0.0


def test_mean_vector() -> None:
    assert ta.mean_vector([{"a": 1.0}, {"a": 0.0, "b": 2.0}]) == {"a": 0.5, "b": 1.0}
    assert ta.mean_vector([]) == {}


def test_tfidf_fit_transform() -> None:
    corpus = ["billing invoices and payments", "shipping parcels and tracking", "billing refunds"]
    model = ta.fit(corpus)
    assert model.document_count == 3
    assert {"bill", "invoic", "payment", "ship", "parcel", "track", "refund"} <= model.vocabulary
    # A rarer term weighs more than a common one.
    assert model.idf["invoic"] > model.idf["bill"]
    assert model.idf["bill"] == pytest.approx(math.log(4 / 3) + 1)
    vec = ta.transform(model, "billing invoices")
    assert math.isclose(sum(v * v for v in vec.values()), 1.0)
    assert vec["invoic"] > vec["bill"]
    # Unknown terms are ignored; no known term gives {}.
    assert ta.transform(model, "completely unrelated zebra") == {}
    q = ta.transform(model, "where are my refunds for billing")
    scores = [ta.cosine_similarity(q, ta.transform(model, doc)) for doc in corpus]
    assert scores.index(max(scores)) == 2


# --- the one front-matter parser and bytes helper ------------------------------------------------

def test_front_matter_split_and_offsets() -> None:
    from robot_lab.text.frontmatter import parse, split_front_matter

    assert split_front_matter("no front matter\n", "t.md") == ({}, "no front matter\n")
    assert split_front_matter("---\nmodel: x\n---\nBody é\n", "t.md") == ({"model": "x"}, "Body é\n")
    raw = "\ufeff---\nname: a\n...\nbody\n".encode()
    parsed = parse(raw, "s.md", required=True)
    assert parsed.data == {"name": "a"} and raw[parsed.body_offset:] == b"body\n" and parsed.body_line == 4


def test_front_matter_errors_name_source_and_line() -> None:
    from robot_lab.errors import ConfigurationError
    from robot_lab.text.frontmatter import parse, split_front_matter

    with pytest.raises(ConfigurationError, match=r"^t.md:4: malformed YAML front matter.*started on line 3"):
        split_front_matter("---\nok: 1\nbad: [x\n---\n", "t.md")
    with pytest.raises(ConfigurationError, match="never closed"):
        split_front_matter("---\nok: 1\n", "t.md")
    with pytest.raises(ConfigurationError, match=r"^t.md:2: front matter must be a mapping"):
        split_front_matter("---\n- a\n---\n", "t.md")
    with pytest.raises(ConfigurationError, match=r"^s.md:1: no YAML front matter"):
        parse(b"plain\n", "s.md", required=True)


def test_as_str() -> None:
    from robot_lab.text.strings import as_str

    assert as_str(b"caf\xc3\xa9") == "café"
    assert as_str("x") == "x"
    assert as_str(None) == ""
    assert as_str(3) == "3"
