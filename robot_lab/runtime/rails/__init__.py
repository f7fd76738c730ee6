"""Cross-cutting guards around every model and tool call (Dramatiq's middleware seam):
:mod:`.budget` (token/cost ledgers in Redis), :mod:`.doom_loop` (repeat detection and the
tool-round circuit breaker) and :mod:`.hooks` (robot_lab's seven hook families)."""
