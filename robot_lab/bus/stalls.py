"""Conversations whose head nobody runs: what ``robot-lab status`` reports.

Entries of one conversation run one at a time, in stream order: only the conversation's
head in the inbox's conversation queue may run (see :mod:`robot_lab.bus.stream_scripts`). A head
that has been waiting longer than the visibility timeout plus one reclaim sweep, without a live consumer running
it, means the conversation is stalled: its consumer died and nobody reclaimed the entry, or
a consumer holds it without running it (a reclaimed head queued behind later entries), or a consumer is busy for that
long with other entries. Each is worth a look, so status lists them.

"Running" is read from the conversation heads hash (``Keys.conversation_heads``): ACQUIRE
records the consumer it granted the head to; the head runs while that consumer still owns
the pending entry and heart-beats it (idle time under the visibility timeout).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from robot_lab.text.strings import as_str as _s

if TYPE_CHECKING:
    from robot_lab.bus.core import Bus


def queue_range(conversation_id: str) -> tuple[bytes, bytes]:
    """``ZRANGEBYLEX`` bounds of one conversation's members in the conversation queue
    (the member layout of robot_lab/bus/stream_scripts.py)."""
    prefix = f"{len(conversation_id.encode())}:{conversation_id}:".encode()
    return b"[" + prefix, b"(" + prefix + b"\xff"


def queue_entry(member: bytes | str, conversation_id: str) -> str:
    """The stream entry id of a conversation queue member (padding removed)."""
    raw = member.decode() if isinstance(member, bytes) else member
    ms, _, seq = raw[len(f"{len(conversation_id.encode())}:{conversation_id}:"):].partition("-")
    return f"{int(ms)}-{int(seq)}"


def sweep_interval(visibility_timeout: float) -> float:
    """Seconds between a consumer's reclaim sweeps (``XAUTOCLAIM``) by default."""
    return max(0.05, visibility_timeout / 2)


@dataclass(frozen=True, slots=True)
class StalledConversation:
    """One conversation whose head has waited too long with nobody running it."""

    robot: str
    conversation: str
    head: str  # stream entry id of the head
    consumer: str  # who owns the pending head now
    runner: str  # whom ACQUIRE last granted it to ('' when never)
    waiting_s: float  # since it became head, or was last granted to a new runner
    idle_s: float  # the pending entry's idle time (over the visibility timeout: nobody beats it)
    deliveries: int

    def describe(self) -> str:
        owner = f"held by consumer {self.consumer!r}"
        state = ("its runner stopped heart-beating it" if self.runner and self.runner == self.consumer
                 else "not running")
        return (f"{self.robot}: conversation {self.conversation!r} stalled: head {self.head} waiting "
                f"{self.waiting_s:.0f} s, {owner}, {state} (delivered {self.deliveries} time(s))")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stalled_conversations(
    bus: Bus, robot: str, *, visibility_timeout: float | None = None, limit: int = 1000
) -> list[StalledConversation]:
    """Conversations of ``robot`` whose head has waited longer than the visibility timeout
    plus one sweep without a live runner. Reads at most ``limit`` conversations."""
    vis = float(visibility_timeout or bus.settings.visibility_timeout)
    threshold_ms = (vis + sweep_interval(vis)) * 1000
    r, keys = bus.redis, bus.keys
    inbox = keys.inbox(robot)
    heads: list[tuple[str, str, int, str]] = []
    for cid, value in r.hscan_iter(keys.conversation_heads(robot), count=200):
        head, _, rest = _s(value).partition("|")
        since, _, runner = rest.partition("|")
        heads.append((_s(cid), head, int(since or 0), runner))
        if len(heads) >= limit:
            break
    if not heads:
        return []
    pipe = r.pipeline(transaction=False)
    pipe.time()
    for cid, head, _since, _runner in heads:
        low, high = queue_range(cid)
        pipe.zrangebylex(keys.conversation_queue(robot), low, high, start=0, num=1)
        pipe.xpending_range(inbox, robot, min=head, max=head, count=1)
    replies = pipe.execute()
    sec, usec = replies[0]
    now_ms = int(sec) * 1000 + int(usec) // 1000
    found: list[StalledConversation] = []
    for i, (cid, head, since, runner) in enumerate(heads):
        first, pending = replies[1 + 2 * i], replies[2 + 2 * i]
        current = queue_entry(first[0], cid) if first else None
        if current != head or now_ms - since <= threshold_ms or not pending:
            # moved on meanwhile, not waiting long enough, or a head acked by hand (pending
            # nowhere: the next ACQUIRE of whoever waits behind it drops it)
            continue
        consumer = _s(pending[0]["consumer"])
        idle_ms = int(pending[0]["time_since_delivered"])
        if runner and runner == consumer and idle_ms < vis * 1000:
            continue  # a live consumer runs it (a long handler is no stall)
        found.append(StalledConversation(
            robot=robot, conversation=cid, head=head, consumer=consumer, runner=runner,
            waiting_s=(now_ms - since) / 1000, idle_s=idle_ms / 1000,
            deliveries=int(pending[0]["times_delivered"]),
        ))
    return found
