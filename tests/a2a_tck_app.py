"""The agent the A2A TCK (``../shared/tools/a2a-tck``) runs against: robot ``tck``.

``robot-lab worker tck --app a2a_tck_app:app`` and ``robot-lab a2a --app a2a_tck_app:app
--robots tck --anonymous`` serve it from the tests folder (``tests/test_a2a_tck_procs.py``;
the same for ``tck-asks``, which asks first). The suite's own system under test acts on the
*messageId* prefixes of its messages; a robot sees a message's text only (its model's input
is the conversation), so this one is scripted on the texts the suite sends: the artifact
scenario's text gets the suite's expected text artifact, anything else is echoed and
completes. What that leaves out is listed in
docs/a2a.md ("Conformance: the A2A TCK").
"""

from __future__ import annotations

from robot_lab import App
from robot_lab.llm.scripted import register_script

register_script("a2a-tck", {
    "rules": [{"when": {"contains": "TCK artifact test"}, "reply": "Generated text content"}],
    "default": {"reply": "{message}"},
})

app = App("a2atck", import_path="a2a_tck_app:app")
app.robot("tck", model="scripted/a2a-tck", description="The A2A TCK's agent: completes every task with a text reply.")

# the same agent for the suite's tests that need a task left input-required (``tck-input-required``):
# it asks first; the answer (the next message on the task) completes it
register_script("a2a-tck-asks", {"turns": [
    {"tool_calls": [{"name": "ask_user", "arguments": {"question": "TCK: what next?"}}]},
    {"reply": "{tool_results}"}]})
app.robot("tck-asks", model="scripted/a2a-tck-asks", description="The A2A TCK's agent that asks first.",
          local_tools=["robot_lab.runtime.durable.human:AskUser"])
