"""Cross-cutting guards around every model and tool call (Dramatiq's middleware seam):
:mod:`.budget` (token/cost ledgers in Redis), :mod:`.doom_loop` (repeat detection and the
tool-round circuit breaker) and :mod:`.hooks` (the Ruby gem's seven hook families)."""
