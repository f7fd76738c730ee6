"""The support-desk demo app (``ROBOT_LAB_APP=robot_lab.demo:app``).

A classifier routes a customer message to billing, technical or general support; a parallel
analysis stage (sentiment, urgency) reads the answer and writes its findings to the run's
shared memory; a summarizer writes the final note. Every robot runs on the offline scripted
model, with scripts registered when this module is imported -- which is why workers are
started with this app (plain ``rq worker`` processes import it from the run record too).
"""

from __future__ import annotations

import os

from robot_lab.app import App
from robot_lab.llm.scripted import register_script, register_script_family

# The default delay of every scripted call; `robot-lab demo --delay-ms N` picks another per
# run instead (its robots use ``scripted/demo-<robot>@N``, built by :func:`_family`).
DEFAULT_DELAY_MS = int(os.environ.get("ROBOT_LAB_DEMO_DELAY_MS", "400"))
SAMPLE_MESSAGES = (
    "I was charged twice for my invoice this month and I want a refund!",
    "The app crashes with an error every time I try to log in.",
    "Do you have an office in Lisbon?",
)


def scripts(delay_ms: int = DEFAULT_DELAY_MS) -> dict[str, dict]:
    """The scripted-model scripts of the demo robots (rules match the last user message)."""
    d = delay_ms
    return {
        "demo-classifier": {
            "rules": [
                {"when": {"regex": r"invoice|refund|charge|bill|payment"}, "route": "billing", "sleep_ms": d},
                {"when": {"regex": r"error|crash|bug|log ?in|password"}, "route": "technical", "sleep_ms": d},
            ],
            "default": {"route": "general", "sleep_ms": d},
        },
        "demo-billing": {"default": {
            "reply": "Billing: I found the duplicate charge on your invoice and issued a refund "
                     "of the second payment; it will show within 5 days. (request: {message})",
            "sleep_ms": d}},
        "demo-technical": {"default": {
            "reply": "Technical: the login crash is a known error fixed in version 2.4.1; please "
                     "update the app and sign in again. (request: {message})",
            "sleep_ms": d}},
        "demo-general": {"default": {
            "reply": "General: thanks for asking! Our team will get back to you with the details. "
                     "(request: {message})",
            "sleep_ms": d}},
        "demo-sentiment": {
            "rules": [{"when": {"regex": r"twice|crash|refund!|error"}, "reply": "sentiment: frustrated",
                       "sleep_ms": d}],
            "default": {"reply": "sentiment: neutral", "sleep_ms": d},
        },
        "demo-urgency": {
            "rules": [{"when": {"regex": r"charged|crash|every time"}, "reply": "urgency: high",
                       "sleep_ms": int(d * 1.5)}],
            "default": {"reply": "urgency: normal", "sleep_ms": int(d * 1.5)},
        },
        "demo-summarizer": {"default": {
            "reply": "Summary for the support log:\n{message}", "sleep_ms": d}},
    }


def register_scripts(delay_ms: int = DEFAULT_DELAY_MS) -> None:
    for name, script in scripts(delay_ms).items():
        register_script(name, script)


def _family(name: str) -> dict | None:
    """``demo-<robot>@<ms>``: the demo script of <robot> with <ms> delays."""
    base, _, delay = name.partition("@")
    if not delay.isdigit():
        return None
    return scripts(int(delay)).get(base)


def build_app(delay_ms: int | None = None) -> App:
    """The demo app; with ``delay_ms`` its robots use that delay wherever they run."""
    app = App("support-desk", import_path="robot_lab.demo:app")
    suffix = "" if delay_ms is None else f"@{delay_ms}"
    robots = {
        name: app.robot(name, model=f"scripted/demo-{name}{suffix}", system_prompt=prompt)
        for name, prompt in (
            ("classifier", "Route the customer's message to billing, technical or general support."),
            ("billing", "You answer billing questions."),
            ("technical", "You answer technical questions."),
            ("general", "You answer general questions."),
            ("sentiment", "Rate the customer's sentiment."),
            ("urgency", "Rate how urgent the case is."),
            ("summarizer", "Summarize the case for the support log."),
        )
    }
    net = app.network("support", description="support desk: route, analyse in parallel, summarize")
    net.task("classify", robots["classifier"], routes=["billing", "technical", "general"])
    for name in ("billing", "technical", "general"):
        net.task(name, robots[name], depends_on="optional")
    with net.parallel("analysis", depends_on=["billing", "technical", "general"]):
        net.task("sentiment", robots["sentiment"], memory_key="sentiment")
        net.task("urgency", robots["urgency"], memory_key="urgency")
    net.task("summarize", robots["summarizer"], depends_on=["billing", "technical", "general", "analysis"])
    return app


register_scripts()
register_script_family("demo-", _family)
app = build_app()
support = app.networks["support"]
