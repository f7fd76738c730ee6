"""Human input: ``ask_user``, approvals, and where an answer comes from.

:func:`request_input` is the one way a run asks a person. It answers, in order, from:

1. the answer recorded for this step (a parked run resumed after ``robot-lab answer``);
2. the run's ``on_input`` callback (``run(on_input=...)``);
3. a terminal, for an in-process run whose stdin is a TTY (the Ruby gem's ``AskUser``);
4. otherwise it raises :class:`InputRequired`: in a scope that parks (a network task, a
   served message, ``run(durable_id=...)``) the request is recorded and the run parks; a
   plain ``run()`` raises it to the caller, naming the question and what would answer it.

An empty answer is the default; a number picks that choice (1-based), as in robot_lab.
"""

from __future__ import annotations

import sys
from typing import Any

from robot_lab.errors import InputRequired, ToolLoopError
from robot_lab.inputs import Answer, approves
from robot_lab.runtime.durable.scopes import _step, current_runner, on_input_handler
from robot_lab.runtime.tools import Tool
from robot_lab.settings import get_settings


def request_input(question: str, *, choices: list[str] | None = None, default: str | None = None,
                  kind: str = "question", tool: str | None = None, arguments: dict[str, Any] | None = None,
                  timeout: float | None = None, context: dict[str, Any] | None = None) -> Answer:
    """A person's answer to ``question`` (see the module docstring for where it comes from).
    ``context`` is recorded with the request (:func:`recorded_requests` reads it back on a
    resumed attempt of the step)."""
    runner = current_runner()
    step = _step.get()
    recorded_id = step.asks.next_recorded() if step is not None else None
    if runner is not None and recorded_id is not None:
        recorded = runner.answer_for(recorded_id)
        if recorded is not None:  # asked on an earlier attempt and answered since
            step.asks.used += 1  # type: ignore[union-attr]
            return _normalized(recorded, choices, default, kind)
    request = InputRequired(question, choices=choices, default=default, kind=kind, tool=tool, arguments=arguments,
                            timeout=timeout, context=context)
    handler = on_input_handler()
    if handler is not None:
        return _normalized(_as_answer(handler(request), kind), choices, default, kind)
    scope = runner.effective_scope() if runner is not None else None
    if (scope is None or scope.interactive) and _tty():
        return _normalized(_prompt(request, runner.robot if runner else "robot"), choices, default, kind)
    if scope is None or scope.inputs is None:  # nothing can park this run: say what would answer
        request.args = (f"{runner.robot if runner else 'the robot'} asks {question!r} and nothing here can answer: "
                        "pass on_input= to run(), run it on a terminal, or give it a durable_id (or run it as a "
                        "network task or served robot) so it parks until `robot-lab answer`",)
    raise request


def can_park() -> bool:
    """Whether an unanswered question here parks the run (a network task, a served message,
    ``run(durable_id=...)``) rather than failing it."""
    runner = current_runner()
    scope = runner.effective_scope() if runner is not None else None
    return scope is not None and scope.inputs is not None


def recorded_requests() -> list[dict[str, Any]]:
    """The requests the running tool step made on earlier attempts and this attempt has not
    used yet, oldest first, as recorded (with their ``context``). A tool that asks on behalf
    of something outside -- a remote agent's task -- finds there where it left off when the
    step resumes, on whichever worker that is."""
    runner, step = current_runner(), _step.get()
    if runner is None or step is None:
        return []
    out = []
    for rid in step.asks.ids[step.asks.used:]:
        found = runner.request_for(rid)
        out.append({**(found.request if found is not None else {}), "id": rid})
    return out


def skip_recorded(count: int) -> None:
    """Pass over ``count`` of :func:`recorded_requests` (asked and settled on an earlier
    attempt): the step's next question is then the one after them, or a new request."""
    step = _step.get()
    if step is not None and count > 0:
        step.asks.used = min(len(step.asks.ids), step.asks.used + count)


def _as_answer(value: Any, kind: str) -> Answer:
    """What an ``on_input`` callback returned: an Answer, a bool (approval) or text."""
    if isinstance(value, Answer):
        return value
    if isinstance(value, bool):
        return Answer(text="" if value else "denied", approved=value, by="on_input")
    return Answer(text="" if value is None else str(value), by="on_input")


def _normalized(answer: Answer, choices: list[str] | None, default: str | None, kind: str) -> Answer:
    text = answer.text.strip()
    if not text and default is not None:
        text = default
    elif choices and text.isdigit() and 1 <= int(text) <= len(choices):
        text = choices[int(text) - 1]
    approved = answer.approved
    if kind == "approval" and approved is None:  # a typed answer to an approval
        approved = approves(text)
    return Answer(text=text, approved=approved, by=answer.by, timed_out=answer.timed_out)


def _tty() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _prompt(request: InputRequired, robot: str) -> Answer:
    """The Ruby gem's AskUser on a terminal: the question, numbered choices, one line read."""
    print(f"[{robot}] {request.question}", file=sys.stderr)
    for i, choice in enumerate(request.choices or [], 1):
        print(f"  {i}. {choice}", file=sys.stderr)
    hint = " [y/N]" if request.kind == "approval" else (f" [{request.default}]" if request.default else "")
    print(f"> {hint.strip()} ", end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return Answer(text=line.rstrip("\n"), by="terminal")


def denied(tool: str, answer: Answer) -> str:
    """The refusal the model sees for a denied call (``durable.on_deny=fail``: the run fails)."""
    why = f": {answer.text}" if answer.text and answer.text != "denied" else ""
    if get_settings().durable.on_deny == "fail":
        raise ToolLoopError(f"the call of {tool} was denied{why}")
    return f"Error ({tool}): the user denied this call{why}"


class AskUser(Tool):
    """Ask the user a question and wait for the answer (the Ruby gem's ``AskUser``)."""

    name = "ask_user"
    description = ("Ask the user a question and wait for their answer. Use it when you need information or a "
                   "decision only the user can give.")
    parameters = {
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "the question to ask"},
            "choices": {"type": "array", "items": {"type": "string"}, "description": "options to choose from"},
            "default": {"type": "string", "description": "the answer when the user gives none"},
        },
        "required": ["question"],
    }
    import_path = "robot_lab.runtime.durable.human:AskUser"
    input_timeout: float | None = None

    def execute(self, question: str, choices: list[str] | None = None, default: str | None = None) -> str:
        return request_input(question, choices=choices, default=default, timeout=self.input_timeout).text


ask_user = AskUser
