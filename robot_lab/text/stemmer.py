"""Word stems for the TF vectors: the Porter stemmer of the ``snowballstemmer`` package.

the Ruby gem's ``String#word_hash`` (``classifier`` gem) stems with the ``fast-stemmer`` gem,
Martin Porter's reference C stemmer. Snowball's ``porter`` algorithm is the same 1980
algorithm, well kept and pure Python, so robot-lab uses it instead of a hand-written copy.
One deliberate difference: the C code's two departures from the paper (``-bli -> -ble``,
``-logi -> -log``) are not made, so ``assembly`` stems to ``assembli`` rather than
``assembl``. No robot-lab feature compares stems with stems computed elsewhere (vectors are
always built on both sides by this module), so only these rare words change, and the same way
on both sides. Snowball's ``english`` ("Porter2") was not chosen because it moves further from
the gem (``generous`` stays ``generous``; Porter and the gem give ``gener``).

Snowball stemmer objects keep per-call state, so each thread gets its own.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import snowballstemmer

_local = threading.local()


def _stemmer() -> snowballstemmer.Stemmer:
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("porter")
    return stemmer


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Porter stem of a lower-case ``word`` (``connections`` -> ``connect``)."""
    return str(_stemmer().stemWord(word))


__all__ = ["stem"]
