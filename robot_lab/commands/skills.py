"""``robot-lab skills``: list, show, validate, create and try matching AgentSkills."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from robot_lab.errors import ConfigurationError

SKILL_TEMPLATE = """---
{head}
# agentskills.io keys: license, compatibility, metadata, allowed-tools
# robot-lab capabilities for scripts/: requests, granted only as far as the operator's
# settings allow (settings.sandbox, skills.grants.<name>, skills.core_trusted):
fs_read: []
fs_write: []
network: false
timeout: 30
# env: [SOME_VAR]        # host variables the scripts may see, if sandbox.env or the grant lists them
# secrets: [SOME_TOKEN]  # like env (sandbox.secrets or the grant), and masked in logs
---
# {title}

Write the instructions the robot should follow when this skill is active.

## When to use
- ...

## Steps
1. ...

Scripts in `scripts/` become tools (name from the file name, description from the first
comment line or docstring); call `hello` with an `args` string.
"""

SCRIPT_TEMPLATE = '''"""Say hello; an example tool for the {name} skill (replace me)."""
import sys

print("hello from {name}:", " ".join(sys.argv[1:]) or "(no args)")
'''


def _console(*, tables: bool = False) -> Any:
    """A console; for ``tables``, one that never wraps names when piped: a file or pipe
    gets a very wide page (unless COLUMNS says otherwise), a terminal its own width."""
    from rich.console import Console  # lazy: start-up time

    console = Console(soft_wrap=False)
    if tables and not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(soft_wrap=False, width=10_000)
    return console


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _catalog(roots: tuple[str, ...]) -> Any:
    from robot_lab.skills.catalog import Root, SkillCatalog, default_roots  # lazy: start-up time

    extra = [Root(Path(r).expanduser(), "--root") for r in roots]
    return SkillCatalog([*extra, *default_roots()])


def _hidden_note(catalog: Any) -> None:
    """Say where bundles kept in dot-folders are (openai/skills: skills/.curated): not scanned."""
    for folder, count in getattr(catalog, "hidden", []):
        click.echo(f"note: {folder} holds {count} bundle(s) in a dot-folder, which is not scanned; "
                   f"add it as a root: --root {folder}", err=True)


def _short(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


root_option = click.option(
    "--root", "roots", multiple=True, type=click.Path(file_okay=False, exists=True),
    help="Extra skills root, searched before the standard ones (repeatable).",
)


@click.group()
def skills() -> None:
    """AgentSkills (SKILL.md bundles): list, show, validate, create, match, eval, doctor."""


@skills.command("list")
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the skills and skipped bundles as JSON.")
def list_skills(roots: tuple[str, ...], as_json: bool) -> None:
    """Every skill in the catalog, and the bundles that did not load."""
    from rich.table import Table  # lazy: start-up time

    catalog = _catalog(roots)
    if as_json:
        _echo_json({
            "skills": [{"name": s.name, "root": s.root, "path": str(s.path), "description": s.description,
                        "tools": [t.name for t in s.script_tools()], "warnings": list(s.warnings)}
                       for s in catalog.all()],
            "skipped": [{"path": str(p.path), "error": p.message} for p in catalog.problems],
        })
        return
    console = _console(tables=True)
    table = Table(title="Skills", show_lines=False)
    table.add_column("name", no_wrap=True)
    table.add_column("root", no_wrap=True)
    for column in ("description", "tools", "warnings"):
        table.add_column(column, overflow="fold")
    for skill in catalog.all():
        table.add_row(skill.name, f"{skill.root}\n{skill.path.parent}", _short(skill.description),
                      str(len(skill.script_tools())), "\n".join(_short(w, 60) for w in skill.warnings) or "-")
    console.print(table)
    if not catalog.all():
        console.print("no skills found in: " + ", ".join(str(r.path) for r in catalog.roots))
    for problem in catalog.problems:  # plain lines: long paths must stay greppable
        click.echo(f"skipped {problem.path}: {problem.message}")
    _hidden_note(catalog)


def _mode(skill: Any, grant: Any) -> str:
    """How this skill's scripts would run here."""
    from robot_lab.settings import get_settings  # lazy: start-up time
    from robot_lab.sandbox.sandbox import bwrap_status  # lazy: start-up time

    if grant.core:
        return "unconfined (trust: core granted by skills.core_trusted)"
    sandbox = get_settings().sandbox
    usable, reason = bwrap_status() if sandbox.enabled else (False, "sandbox.enabled is false")
    if usable:
        return "bwrap"
    return f"{'unconfined' if sandbox.when_unavailable == 'unconfined' else 'refused'} ({reason})"


def _caps_line(caps: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in caps.items())


@skills.command()
@click.argument("name")
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print what the skill asks for and gets as JSON.")
def show(name: str, roots: tuple[str, ...], as_json: bool) -> None:
    """Front matter, asked vs granted capabilities, limits, script tools and instructions."""
    from robot_lab.settings import get_settings  # lazy: start-up time
    from robot_lab.sandbox.limits import limit_status  # lazy: start-up time
    from robot_lab.sandbox.sandbox import bwrap_status  # lazy: start-up time
    from robot_lab.sandbox.trust import describe  # lazy: start-up time

    catalog = _catalog(roots)
    try:
        skill = catalog.get(name)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    checked = skill.review()
    limits = limit_status(get_settings().sandbox, bwrap=bwrap_status()[0])
    tools = skill.script_tools()
    if as_json:
        _echo_json({"name": skill.name, "root": skill.root, "path": str(skill.path),
                    "description": skill.description, "asked": describe(checked.asked),
                    "granted": describe(checked.grant), "decisions": [d.as_dict() for d in checked.decisions],
                    "mode": _mode(skill, checked.grant), "limits": limits,
                    "tools": [{"name": t.name, "description": t.description, "command": t.command} for t in tools],
                    "warnings": list(skill.warnings)})
        return
    console = _console()
    console.print(f"[bold]{skill.name}[/bold]  ({skill.root}: {skill.path})", highlight=False)
    console.print(f"description: {skill.description}", highlight=False, markup=False)
    if skill.allowed_tools is not None:
        console.print(f"allowed-tools: {', '.join(skill.allowed_tools)}", markup=False)
    # plain lines (never wrapped): operators grep them
    click.echo(f"asked:    {_caps_line(describe(checked.asked))}")
    click.echo(f"granted:  {_caps_line(describe(checked.grant))}")
    for decision in checked.decisions:
        click.echo(f"  {decision.line()}")
    click.echo(f"mode: {_mode(skill, checked.grant)}")
    click.echo(f"limits: processes {limits['processes']}; memory {limits['memory']}")
    if skill.extra:
        console.print(f"other keys: {skill.extra}", markup=False)
    for tool in tools:
        console.print(f"tool {tool.name}: {tool.description}  [{' '.join(tool.command)}]", markup=False)
    for script, plan in skill.script_plans():
        if plan.kind in ("library", "data"):
            console.print(f"{plan.kind} scripts/{script.name}: not a tool ({plan.why})", markup=False)
    for warning in skill.warnings:
        console.print(f"[yellow]warning[/yellow] {warning}", highlight=False)
    console.rule("instructions")
    console.print(skill.instructions, markup=False, highlight=False)


def _bundles(path: Path) -> list[Path]:
    """``path`` itself when it is a bundle (or a file), else the bundles directly inside it.
    A bundle has ``SKILL.md`` or ``skill.md``: the lowercase one is reported, never passed over."""
    from robot_lab.skills.conformance import skill_file  # lazy: start-up time

    if path.is_file() or skill_file(path) is not None:
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_dir() and skill_file(p) is not None)
        if found:
            return found
    return [path]


@skills.command("validate")
@click.option("--strict", is_flag=True,
              help="agentskills.io rules, duplicate keys, and requests beyond the operator's ceiling are errors; "
                   "robot-lab's own keys (timeout, network, ...) stay allowed.")
@click.option("--spec", is_flag=True,
              help="Only the agentskills.io specification, read as skills-ref reads it: robot-lab's own keys "
                   "are errors, operator grants are not checked.")
@click.option("--json", "as_json", is_flag=True, help="Print each bundle's issues and grants as JSON.")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def validate_cmd(strict: bool, spec: bool, as_json: bool, paths: tuple[str, ...]) -> None:
    """Check skill bundles (a skill folder, its SKILL.md, or a folder of skills), and what
    each asks for against what this operator's settings grant; with --spec, only whether
    the bundle meets the agentskills.io specification (the verdict skills-ref gives)."""
    if strict and spec:
        raise click.UsageError("--strict and --spec answer different questions; give one")
    check = _spec_check if spec else _lenient_check
    failed = 0
    report = []
    for given in paths:
        for bundle in _bundles(Path(given)):
            ok, entry, lines = check(bundle, strict)
            failed += not ok
            if as_json:
                report.append(entry)
                continue
            for line in lines:
                click.echo(line)
    if as_json:
        _echo_json({"strict": strict, "spec": spec, "failed": failed, "bundles": report})
    elif failed:
        what = "do not meet the agentskills.io specification" if spec else "failed validation"
        click.echo(f"{failed} bundle(s) {what}", err=True)
    if failed:
        sys.exit(1)


def _lenient_check(bundle: Path, strict: bool) -> tuple[bool, dict[str, Any], list[str]]:
    """One bundle as robot-lab loads it, and what it asks for against this operator's grants:
    (ok, its JSON entry, its text lines)."""
    from robot_lab.skills.skill import validate  # lazy: start-up time
    from robot_lab.sandbox.trust import describe  # lazy: start-up time

    skill, issues = validate(bundle, strict=strict)
    ok = not any(i.level == "error" for i in issues)
    checked = skill.review() if skill else None
    entry = {"path": str(bundle), "name": skill.name if skill else None, "ok": ok,
             "issues": [{"level": i.level, "message": i.message} for i in issues],
             "asked": describe(checked.asked) if checked else None,
             "granted": describe(checked.grant) if checked else None,
             "decisions": [d.as_dict() for d in checked.decisions] if checked else []}
    label = skill.name if skill else bundle
    return ok, entry, [f"{'ok' if ok else 'FAIL'}  {label}  ({bundle})", *(f"  {issue}" for issue in issues)]


def _spec_check(bundle: Path, strict: bool) -> tuple[bool, dict[str, Any], list[str]]:
    """``validate --spec`` on one bundle (:mod:`robot_lab.skills.conformance`, skills-ref's rules;
    ``strict`` is never set with it). A valid bundle that robot-lab would still not load (a
    lowercase skill.md) gets a note."""
    from robot_lab.skills.conformance import spec_errors  # lazy: start-up time
    from robot_lab.skills.skill import lowercase_hint  # lazy: start-up time

    errors = spec_errors(bundle)
    hint = lowercase_hint(bundle.parent if bundle.is_file() else bundle)
    notes = [f"robot-lab skips this bundle{hint}"] if hint else []
    entry = {"path": str(bundle), "ok": not errors, "errors": errors, "notes": notes}
    return not errors, entry, [f"{'FAIL' if errors else 'ok'}  {bundle}", *(f"  error: {e}" for e in errors),
                               *(f"  note: {n}" for n in notes)]


@skills.command()
@click.argument("name")
@click.option("--root", "root", type=click.Path(file_okay=False), default="~/.prompts/skills", show_default=True,
              help="Folder to create the skill in.")
@click.option("--description", default=None, help="The description (what the skill does and when to use it).")
def create(name: str, root: str, description: str | None) -> None:
    """Create a template skill bundle NAME (SKILL.md and scripts/hello.py)."""
    from robot_lab.skills.skill import MAX_NAME, NAME_RE  # lazy: start-up time

    if not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise click.ClickException(
            f"skill name {name!r} must be 1-{MAX_NAME} lowercase letters, digits and single hyphens")
    import yaml  # lazy: start-up time

    folder = Path(root).expanduser() / name
    if folder.exists():
        raise click.ClickException(f"{folder} already exists; not overwriting")
    (folder / "scripts").mkdir(parents=True)
    description = " ".join((description or f"Describe what {name} does and when to use it.").split())
    # yaml.safe_dump quotes what needs quoting ("Use when: ...", '#', leading '-' ...)
    head = yaml.safe_dump({"name": name, "description": description}, sort_keys=False, allow_unicode=True,
                          width=10_000).strip()
    (folder / "SKILL.md").write_text(SKILL_TEMPLATE.format(
        head=head, title=name.replace("-", " ").title()), encoding="utf-8")
    (folder / "scripts" / "hello.py").write_text(SCRIPT_TEMPLATE.format(name=name), encoding="utf-8")
    click.echo(f"created {folder}/SKILL.md and scripts/hello.py; edit them, then: robot-lab skills validate {folder}")


@skills.command()
@click.argument("message")
@root_option
@click.option("--threshold", type=float, default=None,
              help="Match every skill at or above this score instead of the model's rule.")
@click.option("--embedder", type=click.Choice(["settings", "fastembed", "tfidf"]), default="settings",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
def match(message: str, roots: tuple[str, ...], threshold: float | None, embedder: str, as_json: bool) -> None:
    """Score MESSAGE against every skill in the catalog, and show which the rule picks.

    --json prints {embedder, fallback_from, floor, margin, max_selected, matched: [names],
    scores: [{name, score, matched, description}]}, best first.
    """
    from rich.table import Table  # lazy: start-up time

    from robot_lab.settings import get_settings  # lazy: start-up time
    from robot_lab.skills.embedding import TfidfEmbedder, load_embedder  # lazy: start-up time
    from robot_lab.skills.matching import SkillMatcher, cap_selected, select  # lazy: start-up time

    if not message.strip():
        raise click.BadParameter("MESSAGE is empty: give the text to score", param_hint="MESSAGE")
    settings = get_settings()
    if embedder == "tfidf":
        chosen: Any = TfidfEmbedder()
    elif embedder == "fastembed":
        chosen = load_embedder(settings.model_copy(update={"skills": settings.skills.model_copy(
            update={"embedder": "fastembed"})}), quiet=True)
    else:
        chosen = load_embedder(settings, quiet=True)
    # said once, in this command's own output, instead of a log warning on every call
    fallback = getattr(chosen, "fallback_from", None)
    fallback_note = (f"{fallback} is not available here, so matching is lexical (TF-IDF); set "
                     "skills.embedding_model_path to a local model folder for semantic matching") if fallback else None
    catalog = _catalog(roots)
    matcher = SkillMatcher(chosen, threshold, settings=settings)
    skills = catalog.all()
    if not skills:
        _hidden_note(catalog)
    try:
        scored = matcher.scores(message, skills)
    except Exception as exc:
        raise click.ClickException(f"embedding failed: {type(exc).__name__}: {exc}") from None
    rule = matcher.rule
    limit = int(settings.skills.max_selected)
    picked = {s.name for s in cap_selected(select(scored, rule), {s.name: v for s, v in scored}, limit)}
    ranked = sorted(scored, key=lambda item: -item[1])
    if as_json:
        _echo_json({"embedder": chosen.name, "fallback_from": fallback, "floor": rule.floor, "margin": rule.margin,
                    "max_selected": limit,
                    "matched": [s.name for s, _ in ranked if s.name in picked],
                    "scores": [{"name": s.name, "score": round(score, 4), "matched": s.name in picked,
                                "description": s.description} for s, score in ranked]})
        return
    margin = "" if rule.margin >= 1 else f", margin {rule.margin:.2f}"
    caption = f"note: {fallback_note}" if fallback_note else None
    table = Table(title=f"embedder {chosen.name}, floor {rule.floor:.2f}{margin}", caption=caption)
    table.add_column("score")
    table.add_column("match")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    for skill, score in ranked:
        table.add_row(f"{score:.3f}", "yes" if skill.name in picked else "", skill.name, _short(skill.description))
    _console(tables=True).print(table)


@skills.command()
@click.argument("names", nargs=-1)
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print each bundle's needs and install lines as JSON.")
@click.option("--venv", "venv", type=click.Path(file_okay=False), default=None,
              help="Create a virtual environment here with the Python packages the skills need (pip, needs the "
                   "package index), and print the skills.python setting that uses it.")
def doctor(names: tuple[str, ...], roots: tuple[str, ...], as_json: bool, venv: str | None) -> None:
    """What the skills' scripts need on this machine (Python packages, programs, node
    modules), what is missing, and the lines that install it. Every skill, or NAMES.

    Reads the bundles without running them. Exit status 1 when something is missing.
    """
    from robot_lab.skills.doctor import diagnose  # lazy: start-up time

    catalog = _catalog(roots)
    try:
        chosen = [catalog.get(n) for n in names] if names else catalog.all()
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    found = [diagnose(skill) for skill in chosen]
    if venv is not None:
        _make_venv(Path(venv), sorted({n.install for d in found for n in d.needs if n.kind == "python"}))
        found = [diagnose(skill, python=str(Path(venv).resolve() / "bin" / "python")) for skill in chosen]
    if as_json:
        _echo_json({"skills": [d.as_dict() for d in found]})
    else:
        for d in found:
            missing = d.missing
            click.echo(f"{d.skill}: {'ok' if not missing else f'{len(missing)} missing'} ({d.path})")
            for need in d.needs:
                mark = "ok     " if need.present else "MISSING"
                click.echo(f"  {mark} {need.kind:<7} {need.name}  ({', '.join(need.used_in[:3])}"
                           f"{', ...' if len(need.used_in) > 3 else ''})")
            for line in d.install_lines():
                click.echo(f"  install: {line}")
        if not found:
            click.echo("no skills found in: " + ", ".join(str(r.path) for r in catalog.roots))
    if any(d.missing for d in found):
        sys.exit(1)


def _make_venv(folder: Path, packages: list[str]) -> None:
    """A fresh venv (not robot-lab's packages: a bundle may need other versions, such as
    mcp-builder's mcp 1.x) holding ``packages``; says which setting points skills at it."""
    import subprocess  # lazy: start-up time
    import venv as venv_mod  # lazy: start-up time

    if not (folder / "bin" / "python").exists():
        venv_mod.EnvBuilder(with_pip=bool(packages)).create(folder)
    python = folder.resolve() / "bin" / "python"
    if packages:
        click.echo(f"installing into {folder}: {' '.join(packages)}", err=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages])
        if done.returncode != 0:
            raise click.ClickException(f"pip could not install {' '.join(packages)} into {folder} (exit {done.returncode})")
    click.echo(f"venv ready: set ROBOT_LAB_SKILLS__PYTHON={python} (every skill), or "
               f"skills.root_python = {{\"<skills root>\": \"{python}\"}} (one root's skills)", err=True)


@skills.command("eval")
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False))
@root_option
@click.option("--embedder", type=click.Choice(["settings", "fastembed", "tfidf"]), default="settings",
              show_default=True)
@click.option("--max-fp", type=float, default=0.10, show_default=True,
              help="Largest share of unrelated prompts a chosen rule may match.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_cmd(prompts: str, roots: tuple[str, ...], embedder: str, max_fp: float, as_json: bool) -> None:
    """Measure matching on labelled PROMPTS (YAML: prompts: [{text, skill | null}]).

    Prints top-1 accuracy, recall and false positives of the configured rule, and the rule
    the evidence picks (put it in skills.match_rules).
    """
    from robot_lab.settings import get_settings  # lazy: start-up time
    from robot_lab.skills.embedding import TfidfEmbedder, load_embedder  # lazy: start-up time
    from robot_lab.skills.evaluation import choose_rule, evaluate, load_prompts, score_all  # lazy: start-up time
    from robot_lab.skills.matching import SkillMatcher  # lazy: start-up time

    if not 0 <= max_fp <= 1:
        raise click.BadParameter(f"{max_fp} is not a share between 0 and 1 (0.10 = 10 %)", param_hint="--max-fp")
    settings = get_settings()
    if embedder == "tfidf":
        chosen_embedder: Any = TfidfEmbedder()
    elif embedder == "fastembed":
        chosen_embedder = load_embedder(settings.model_copy(update={"skills": settings.skills.model_copy(
            update={"embedder": "fastembed"})}), quiet=True)
    else:
        chosen_embedder = load_embedder(settings, quiet=True)
    matcher = SkillMatcher(chosen_embedder, settings=settings)
    try:
        labelled = load_prompts(prompts)
        if not any(p.skill is None for p in labelled):
            raise ConfigurationError(f"{prompts}: no unrelated prompts (skill: null): false positives cannot be "
                                     "measured, so no rule can be chosen; add prompts that should match nothing")
        scored = score_all(matcher, labelled, _catalog(roots).all())
        current = evaluate(labelled, scored, matcher.rule)
        best = choose_rule(labelled, scored, max_fp_rate=max_fp)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None

    def as_dict(report: Any) -> dict[str, Any]:
        return {"floor": report.rule.floor, "margin": report.rule.margin, "top1": report.top1,
                "recall": report.recall, "false_positive_rate": report.fp_unrelated,
                "wrong_extras": report.wrong_extras, "missed": list(report.misses)}

    if as_json:
        _echo_json({"embedder": chosen_embedder.name, "prompts": len(labelled), "configured": as_dict(current),
                    "chosen": as_dict(best)})
        return
    click.echo(f"embedder {chosen_embedder.name}, {len(labelled)} prompts")
    click.echo(f"configured rule: {current.line()}")
    for text in current.misses:
        click.echo(f"  missed: {text}")
    click.echo(f"chosen rule:     {best.line()}")
    for text in best.misses:
        click.echo(f"  missed: {text}")
