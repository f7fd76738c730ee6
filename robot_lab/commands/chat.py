"""``robot-lab chat``: one robot run in this process, streamed to the terminal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from robot_lab.errors import ConfigurationError, RobotLabError


@click.command()
@click.argument("message")
@click.option("--model", "-m", default=None, help="litellm model string; default ROBOT_LAB_MODEL, a provider key's model, else scripted/echo.")
@click.option("--api-base", default=None, metavar="URL",
              help="An OpenAI-compatible server for the model (vLLM, llama-server, Ollama, a LiteLLM proxy): "
                   "-m openai/MODEL --api-base http://127.0.0.1:8080/v1; no key needed for a keyless server.")
@click.option("--system", "-s", "system_prompt", default=None, help="System prompt.")
@click.option("--template", "-t", default=None, help="Template name (a .md file on ROBOT_LAB_TEMPLATE_PATH).")
@click.option("--tool", "tools", multiple=True, metavar="MODULE:FUNC", help="Tool by import path; repeatable. Tools are sent to the model.")
@click.option("--name", default="robot", show_default=True, help="Robot name.")
@click.option("--max-tool-rounds", type=int, default=None, help="Circuit breaker: fail after this many tool calls.")
@click.option("--skills", "skill_names", multiple=True, metavar="NAME",
              help="AgentSkill (or template skill) by name, from the skills roots; repeatable or comma-separated.")
@click.option("--skill-mode", type=click.Choice(["match", "tool"]), default="match", show_default=True,
              help="match: inject the skills that match the message; tool: the model loads them with Skill.")
@click.option("--attach", "attachments", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A file for the skills' working directory; repeatable.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Copy the files the run wrote in its working directory into this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the RobotResult as JSON instead of streaming text.")
def chat(
    message: str,
    model: str | None,
    api_base: str | None,
    system_prompt: str | None,
    template: str | None,
    tools: tuple[str, ...],
    name: str,
    max_tool_rounds: int | None,
    skill_names: tuple[str, ...],
    skill_mode: str,
    attachments: tuple[str, ...],
    out: str | None,
    as_json: bool,
) -> None:
    """Run one robot on MESSAGE and stream its reply.

    \b
    Examples:
      robot-lab chat "hello"                         # offline scripted model
      robot-lab chat -m openai/gpt-4o-mini "hello"   # needs OPENAI_API_KEY
      robot-lab chat -m openai/qwen2.5 --api-base http://127.0.0.1:8080/v1 "hello"
      robot-lab chat --tool mypkg.tools:lookup "find order 42"
      robot-lab chat --skills pdf --attach form.pdf "fill out this form for me"
    """
    try:
        if model and not template:  # refused before the robot (and its runtime) is built
            from robot_lab.llm.gateway import check_model_allowed  # lazy: start-up time

            check_model_allowed(model)
        from robot_lab.runtime.robot import build  # lazy: start-up time

        robot = build(
            name=name,
            model=model,
            api_base=api_base,
            system_prompt=system_prompt,
            template=template,
            local_tools=list(tools),
            max_tool_rounds=max_tool_rounds,
            skills=[n.strip() for names in skill_names for n in names.split(",") if n.strip()],
            skill_mode=skill_mode,
        )
        streamed: list[str] = []
        _quiet_retries(streamed)

        def on_content(chunk) -> None:  # type: ignore[no-untyped-def]
            streamed.append(chunk.content)
            if not as_json:
                sys.stdout.write(chunk.content)
                sys.stdout.flush()

        result = robot.run(message, tools="inherit" if tools else "none", on_content=on_content,
                           # the person at the terminal chose these files: sent as bytes, so
                           # sandbox.attach_from (meant for paths named by remote senders) does not apply
                           attachments=[(Path(a).name, Path(a).read_bytes()) for a in attachments] or None)
    except RobotLabError as exc:  # the class name only where it says more than the message
        from robot_lab.commands.error_lines import one_line  # lazy: start-up time

        name = "" if isinstance(exc, ConfigurationError) else f"{type(exc).__name__}: "
        raise click.ClickException(name + one_line(exc)) from exc
    copied = _copy_out(result, out)
    if as_json:
        click.echo(json.dumps(result.export(), indent=2, default=str))
        return
    if not streamed and result.reply:
        sys.stdout.write(result.reply)
    sys.stdout.write("\n")
    click.echo(
        f"[{robot.model}] tokens in={result.input_tokens} out={result.output_tokens}"
        + (f" tool calls={len(result.tool_calls)}" if result.tool_calls else ""),
        err=True,
    )
    if result.workspace:
        click.echo(f"working directory: {result.workspace}", err=True)
    for item in result.files:
        click.echo(f"file: {item.path} ({item.size} bytes)" + (f" -> {copied[item.path]}" if item.path in copied else ""),
                   err=True)


def _copy_out(result: object, out: str | None) -> dict[str, str]:
    """Copy the run's files (``RobotResult.files``) from its workspace into ``out``."""
    import shutil  # lazy: start-up time

    files = getattr(result, "files", None) or []
    workspace = getattr(result, "workspace", None)
    if out is None or not files or not workspace:
        return {}
    copied: dict[str, str] = {}
    for item in files:
        target = Path(out) / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(workspace) / item.path, target, follow_symlinks=False)
        copied[item.path] = str(target)
    return copied


def _quiet_retries(streamed: list[str]) -> None:
    """Without -v a model call's retry is one plain line on stderr (after a newline when the
    reply's text is on the line), not a log line inside the streamed reply."""
    root = click.get_current_context().find_root()
    if root.params.get("verbose") or root.params.get("debug"):
        return
    from robot_lab.llm.retry import retry_notice  # lazy: start-up time

    def announce(text: str) -> None:
        sys.stdout.flush()
        open_line = bool(streamed) and not "".join(streamed).endswith("\n")
        sys.stderr.write(("\n" if open_line else "") + f"robot-lab: {text}\n")
        sys.stderr.flush()

    retry_notice.set(announce)
