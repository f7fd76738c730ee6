"""The Redis key layout, in one place so docs/architecture.md and the code agree.

Names users see are plain (``robot_lab:bus:billing``). With ``cluster=True`` the robot or
run part is wrapped in a hash tag (``robot_lab:bus:{billing}``) so every key of one robot
or one run lands in one cluster slot and multi-key Lua scripts stay legal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "robot_lab"
    cluster: bool = False

    def _tag(self, part: str) -> str:
        return f"{{{part}}}" if self.cluster else part

    # --- bus ---------------------------------------------------------------------------
    def inbox(self, robot: str) -> str:
        return f"{self.prefix}:bus:{self._tag(robot)}"

    def bus_state(self, robot: str) -> str:
        """Prefix of a robot's own bus keys (DLQ, conversation queue, reply records, outbox,
        parked messages). They sit beside the robot's other keys, not under its inbox name, so that
        ``<prefix>:bus:*`` holds only streams anyone may append to (inboxes and ``_reply.*``
        streams): an ACL pattern can then grant ``XADD`` on inboxes and nothing else
        (docs/security.md, section 3)."""
        return f"{self.prefix}:robot:{self._tag(robot)}"

    def dlq(self, robot: str) -> str:
        return f"{self.bus_state(robot)}:dlq"

    def outbox(self, robot: str) -> str:
        return f"{self.bus_state(robot)}:outbox"

    def replied(self, robot: str) -> str:
        """Prefix of the per-message ``replied_for`` keys (idempotent redelivery)."""
        return f"{self.bus_state(robot)}:replied"

    def outbox_entry(self, robot: str, message_id: str) -> str:
        """Hash of one sent message (status sent/replied); ``:replies`` and ``:signal`` lists
        sit next to it. Per-message keys so each can expire on its own (bus reply_ttl)."""
        return f"{self.outbox(robot)}:{message_id}"

    def replied_for(self, robot: str, message_id: str) -> str:
        """String: the recorded reply of a handled message, so a redelivery re-sends it
        instead of calling the LLM again. The bus passes ``"<from>:<id>"`` (the Ruby gem's message
        key) and stores ``v2:<content hash>:<reply>`` (bus/replies.py); expires after
        ``bus.record_ttl``."""
        return f"{self.replied(robot)}:{message_id}"

    def conversation_queue(self, robot: str) -> str:
        """Sorted set (all scores 0): one member per un-acked conversation entry,
        ``<len>:<conversation id>:<padded entry id>``, so each conversation's entries are
        contiguous and in stream order; the head may run (see robot_lab/bus/stream_scripts.py).
        One key for every conversation, so the bus scripts can declare it in KEYS."""
        return f"{self.bus_state(robot)}:conv-queue"

    def conversation_heads(self, robot: str) -> str:
        """Hash: conversation id -> ``head|since_ms|runner`` of each conversation with
        entries queued (what ``robot-lab status`` reads to find stalled conversations)."""
        return f"{self.bus_state(robot)}:conv-heads"

    def registry(self) -> str:
        """Set of robot names with a registered inbox (the Ruby gem's channel registry)."""
        return f"{self.prefix}:robots"

    def spawned(self) -> str:
        """Set of robot names spawned at run time; ``robot-lab worker --spawned`` serves them."""
        return f"{self.prefix}:robots:spawned"

    def reply_inbox(self, name: str) -> str:
        """Stream a requester waits on for its replies."""
        return f"{self.prefix}:bus:{self._tag(name)}"

    # --- robots / registry --------------------------------------------------------------
    def robot_spec(self, robot: str) -> str:
        return f"{self.prefix}:robot:{self._tag(robot)}:spec"

    def conversation(self, robot: str, conversation_id: str) -> str:
        """String: JSON list of a robot's messages in one conversation (any worker resumes it)."""
        return f"{self.prefix}:robot:{self._tag(robot)}:conv:{conversation_id}"

    # --- memory -------------------------------------------------------------------------
    def memory(self, scope: str) -> str:
        return f"{self.prefix}:mem:{self._tag(scope)}"

    def memory_version(self, scope: str) -> str:
        return f"{self.memory(scope)}:version"

    def memory_changes(self, scope: str) -> str:
        return f"{self.memory(scope)}:changes"

    def memory_channel(self, scope: str) -> str:
        return f"{self.memory(scope)}:notify"

    def memory_cursors(self, scope: str) -> str:
        """Hash: durable subscriber id -> last memory version it processed."""
        return f"{self.memory(scope)}:cursors"

    # --- runs ---------------------------------------------------------------------------
    def run(self, run_id: str) -> str:
        return f"{self.prefix}:run:{self._tag(run_id)}"

    def run_events(self, run_id: str) -> str:
        return f"{self.run(run_id)}:events"

    def tool_calls(self, run_id: str) -> str:
        """List: the tool-call names of one run, capped (cross-process doom-loop detection)."""
        return f"{self.run(run_id)}:tool_calls"

    def runs_index(self) -> str:
        return f"{self.prefix}:runs"

    def runs_active(self) -> str:
        """Set of run ids not finished yet (swept for tasks whose worker died)."""
        return f"{self.prefix}:runs:active"

    def run_lease(self, run_id: str, task: str) -> str:
        """A running task's lease (worker name, PX TTL refreshed by the job's heartbeat)."""
        return f"{self.run(run_id)}:lease:{task}"

    # --- durable runs (step journals, input requests) -----------------------------------
    def run_steps(self, run_id: str, task: str) -> str:
        """Hash: the step journal of one network task (step index -> JSON), across attempts."""
        return f"{self.run(run_id)}:steps:{task}"

    def parked_message(self, robot: str, request_id: str) -> str:
        """String: the envelope of a served message waiting for the answer to ``request_id``.
        One of the robot's own bus keys (:meth:`bus_state`): under ``bus:`` anyone may append,
        so a worker could not write it there and a publisher could squat it as a stream."""
        return f"{self.bus_state(robot)}:parked:{request_id}"

    def parked_conversation(self, robot: str, conversation_id: str) -> str:
        """String: the request id a conversation of ``robot`` waits on (bus/parking.py)."""
        return f"{self.bus_state(robot)}:parked-conv:{conversation_id}"

    def legacy_parked_message(self, robot: str, request_id: str) -> str:
        """Where releases before the move kept :meth:`parked_message` (under the inbox); read
        only, so a message parked there before an upgrade is still answered."""
        return f"{self.inbox(robot)}:parked:{request_id}"

    def durable_steps(self, durable_id: str) -> str:
        """Hash: the step journal of a ``run(durable_id=...)``; a served bus message's id is
        ``bus:<robot>:<from>:<id>`` (its journal across redeliveries)."""
        return f"{self.prefix}:durable:{self._tag(durable_id)}:steps"

    def input_request(self, request_id: str) -> str:
        """Hash: one input request (question, owner, status, answer); answered once."""
        return f"{self.prefix}:input:{self._tag(request_id)}"

    def inputs_pending(self) -> str:
        """Zset: request id -> created time, of requests not answered yet (``robot-lab pending``)."""
        return f"{self.prefix}:inputs:pending"

    def inputs_deadlines(self) -> str:
        """Zset: request id -> deadline (epoch s), of pending requests with an ``input_timeout``."""
        return f"{self.prefix}:inputs:deadlines"

    def run_held(self, run_id: str, task: str) -> str:
        """A queued task's job taken off its queue by a live worker, not started yet (its job
        id, PX TTL refreshed by that worker's lease keeper)."""
        return f"{self.run(run_id)}:held:{task}"

    # --- worker heartbeats ---------------------------------------------------------------
    def worker(self, name: str) -> str:
        """String (JSON, PX TTL): a live ``robot-lab worker`` process's last healthy beat."""
        return f"{self.prefix}:worker:{name}"

    def workers(self) -> str:
        """Zset: worker name -> time of its last beat (index of ``worker`` keys)."""
        return f"{self.prefix}:workers"

    def builds_handed(self) -> str:
        """Zset: ``<build>\\t<run>\\t<task>\\t<job id>`` -> time, of queued tasks a worker of
        another build handed back, re-enqueued once a worker of that build beats (network/builds.py)."""
        return f"{self.prefix}:builds:handed"

    # --- the A2A tier ---------------------------------------------------------------------
    def a2a_task(self, task_id: str) -> str:
        """Hash: one A2A task (its agent, context, what it runs -- a bus message or a network
        run -- its history and, once over, its final Task), so any ``robot-lab a2a`` serves it."""
        return f"{self.prefix}:a2a:task:{self._tag(task_id)}"

    def a2a_tasks(self, agent: str, caller: str) -> str:
        """Zset: the A2A tasks one caller started on one agent (task id -> creation ms), the
        index ``tasks/list`` reads; entries older than ``a2a.task_ttl`` are trimmed on write.
        ``caller`` is %-quoted by the caller of this method (:mod:`robot_lab.a2a.task_store`)."""
        return f"{self.prefix}:a2a:tasks:{self._tag(f'{agent}:{caller}')}"

    def a2a_server(self, name: str) -> str:
        """String (JSON, PX TTL): a live ``robot-lab a2a`` process's last beat."""
        return f"{self.prefix}:a2a:server:{name}"

    def a2a_servers(self) -> str:
        """Zset: A2A server name -> time of its last beat (``robot-lab status``)."""
        return f"{self.prefix}:a2a:servers"

    # --- budgets ------------------------------------------------------------------------
    def budget(self, scope: str) -> str:
        return f"{self.prefix}:budget:{self._tag(scope)}"

    # --- skills -------------------------------------------------------------------------
    def skill_embedding(self, model: str, digest: str) -> str:
        """Bytes (float32) of one skill-description embedding, by model and content hash."""
        return f"{self.prefix}:skills:emb:{model}:{digest}"

    def skill_sticky(self, robot: str, conversation_id: str) -> str:
        """String: JSON list of the skill names a conversation is using (they stick to it)."""
        return f"{self.conversation(robot, conversation_id)}:skills"

    # --- result files -----------------------------------------------------------------------
    def result_file(self, sha256: str) -> str:
        """String: the bytes of a file a reply refers to (too big to travel inline), by digest."""
        return f"{self.prefix}:file:{sha256}"


def glob_escape(text: str) -> str:
    """Escape Redis glob characters in a literal part of a pattern (ACL rules, SCAN)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def is_wrong_type(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis's WRONGTYPE error (also as the error of a Lua script): a key
    of this layout holds another type than the code expects (bus/key_types.py names it)."""
    import redis  # lazy: start-up time

    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)


def wrong_typed(connection: Any, expected: dict[str, str]) -> list[str]:
    """``"<key> is a <type>, not a <expected>"`` for each key of ``expected`` (key -> type)
    that holds another type (one pipelined round trip; a missing key is fine): what a
    WRONGTYPE error, which names no key, is turned into for the person who must fix it."""
    with connection.pipeline(transaction=False) as pipe:
        for key in expected:
            pipe.type(key)
        found = pipe.execute()
    problems = []
    for (key, want), got in zip(expected.items(), found):
        got = got.decode() if isinstance(got, bytes) else str(got)
        if got not in ("none", want):
            problems.append(f"{key} is a {got}, not a {want}")
    return problems


def default_keys() -> Keys:
    """Keys of the configured prefix; cluster hash tags when the ``cluster`` setting is on or
    ``REDIS_URL`` is a ``redis+cluster://`` URL."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    settings = get_settings()
    return Keys(prefix=settings.key_prefix, cluster=settings.cluster_keys)
