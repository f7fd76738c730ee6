"""Durable runs: a step journal in Redis (replay after a crash or a park) and human input
(``ask_user``, approvals, ``InputRequired``). See docs/durable.md."""

from robot_lab.runtime.durable.human import AskUser, ask_user, can_park, recorded_requests, request_input, skip_recorded
from robot_lab.runtime.durable.journal import Journal, request_hash
from robot_lab.inputs import Answer, InputRequest, InputStore
from robot_lab.runtime.durable.scopes import (
    DurableScope,
    StepInfo,
    current_step,
    durable_scope,
    input_handler,
    local_scope,
)
from robot_lab.runtime.durable.steps import StepRunner

__all__ = ["Answer", "AskUser", "DurableScope", "InputRequest", "InputStore", "Journal", "StepInfo", "StepRunner",
           "ask_user", "can_park", "current_step", "durable_scope", "input_handler", "local_scope",
           "recorded_requests", "request_hash", "request_input", "skip_recorded"]
