"""The model layer: :mod:`.gateway` (litellm calls, streaming, retries, usage) and
:mod:`.scripted`, the offline deterministic model that sits at the same seam as real
providers (a litellm custom provider), so tests exercise the real call path."""
