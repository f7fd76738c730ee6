"""Text helpers shared by every layer, one of each (no robot_lab imports beyond errors):

* :mod:`robot_lab.text.analysis` — stemmed term frequencies, TF cosine, TF-IDF;
* :mod:`robot_lab.text.stemmer` — the Porter stemmer (``snowballstemmer``);
* :mod:`robot_lab.text.frontmatter` — YAML front matter of templates and SKILL.md;
* :mod:`robot_lab.text.strings` — bytes read from Redis as str.
"""
