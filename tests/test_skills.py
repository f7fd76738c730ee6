"""AgentSkill loading, the agentskills.io rules, capabilities and the catalog."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from robot_lab.errors import ConfigurationError
from robot_lab.settings import SandboxSettings, Settings
from robot_lab.skills import AgentSkill, Capabilities, SkillCatalog, validate
from robot_lab.skills.catalog import Root, default_roots


def write_skill(
    root: Path,
    name: str,
    description: str | None = "Does a thing when asked about things.",
    body: str = "Follow these steps.",
    *,
    folder: str | None = None,
    extra: str = "",
    scripts: dict[str, str] | None = None,
    executable: tuple[str, ...] = (),
) -> Path:
    """A bundle ``root/<folder or name>/SKILL.md`` (plus scripts) for tests."""
    directory = root / (folder or name)
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["---", f"name: {name}"]
    if description is not None:
        lines.append(f"description: {description}")
    if extra:
        lines.append(textwrap.dedent(extra).strip("\n"))
    lines += ["---", body]
    (directory / "SKILL.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for filename, text in (scripts or {}).items():
        (directory / "scripts").mkdir(exist_ok=True)
        path = directory / "scripts" / filename
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        if filename in executable:
            path.chmod(0o755)
    return directory


# --- AgentSkill ---------------------------------------------------------------------------


def test_loads_front_matter_and_lazy_body(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "pdf-tools", "Extract text from PDF files.", "# PDF\n\nUse pdftotext.\n",
                            extra="license: MIT\nx-custom: 7\nallowed-tools: Read Bash(git:*)")
    skill = AgentSkill(directory / "SKILL.md")
    assert skill.name == "pdf-tools"
    assert skill.description == "Extract text from PDF files."
    assert skill.path == directory.resolve()
    assert skill.license == "MIT"
    assert skill.extra == {"x-custom": 7}
    assert skill.front_matter["x-custom"] == 7  # unknown keys kept
    assert skill.allowed_tools == ("Read", "Bash")
    assert skill._instructions is None  # lazy
    assert skill.instructions == "# PDF\n\nUse pdftotext."
    assert any("unknown front-matter key 'x-custom'" in w for w in skill.warnings)
    # the directory itself works as well as its SKILL.md
    assert AgentSkill(directory).name == "pdf-tools"


def test_body_changes_after_load_are_seen_until_first_read(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "lazy", body="first")
    skill = AgentSkill(directory)
    (directory / "SKILL.md").write_text("---\nname: lazy\ndescription: d\n---\nsecond\n")
    assert skill.instructions == "second"


@pytest.mark.parametrize("missing", ["name", "description"])
def test_missing_required_key_is_configuration_error(tmp_path: Path, missing: str) -> None:
    directory = tmp_path / "s"
    directory.mkdir()
    fm = {"name": "name: s", "description": "description: d"}
    fm.pop(missing)
    (directory / "SKILL.md").write_text("---\n" + "\n".join(fm.values()) + "\n---\nbody\n")
    with pytest.raises(ConfigurationError, match=rf"SKILL.md: front matter is missing '{missing}'"):
        AgentSkill(directory)


def test_blank_description_is_missing(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "blank", description="'   '")
    with pytest.raises(ConfigurationError, match="missing 'description'"):
        AgentSkill(directory)


def test_no_front_matter_names_the_file(tmp_path: Path) -> None:
    directory = tmp_path / "plain"
    directory.mkdir()
    (directory / "SKILL.md").write_text("# Just markdown\n")
    with pytest.raises(ConfigurationError, match=r"plain/SKILL.md:1: no YAML front matter"):
        AgentSkill(directory)


def test_unclosed_front_matter(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir()
    (directory / "SKILL.md").write_text("---\nname: open\ndescription: d\n")
    with pytest.raises(ConfigurationError, match="never closed"):
        AgentSkill(directory)


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    directory = tmp_path / "bad-yaml"
    directory.mkdir()
    (directory / "SKILL.md").write_text("---\nname: bad-yaml\ndescription: ok\nfs_read: [a, b\ntimeout: 3\n---\nbody\n")
    with pytest.raises(ConfigurationError) as info:
        AgentSkill(directory)
    message = str(info.value)
    assert "bad-yaml/SKILL.md:" in message and "malformed YAML front matter" in message
    line = int(message.split("SKILL.md:")[1].split(":")[0])
    assert line in (4, 5, 6)  # the unclosed flow sequence starts on line 4


def test_front_matter_not_a_mapping(tmp_path: Path) -> None:
    directory = tmp_path / "list"
    directory.mkdir()
    (directory / "SKILL.md").write_text("---\n- a\n- b\n---\nbody\n")
    with pytest.raises(ConfigurationError, match="must be a mapping"):
        AgentSkill(directory)


def test_binary_skill_md_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "binary"
    directory.mkdir()
    (directory / "SKILL.md").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + os.urandom(512))
    with pytest.raises(ConfigurationError, match="not a text file"):
        AgentSkill(directory)


def test_symlinked_skill_md_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    outside.write_text("---\nname: escape\ndescription: d\n---\nsecret\n")
    directory = tmp_path / "root" / "escape"
    directory.mkdir(parents=True)
    (directory / "SKILL.md").symlink_to(outside)
    with pytest.raises(ConfigurationError, match="outside the skill directory"):
        AgentSkill(directory)


def test_huge_body_is_cut_with_a_warning_and_not_read_at_load(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "huge", body="x" * (10 * 1024 * 1024))
    skill = AgentSkill(directory)
    assert skill._instructions is None
    text = skill.instructions
    kept, marker = text.split("\n\n[... instructions cut here", 1)
    assert kept == "x" * 50_000  # no space to cut at: cut at the limit
    assert "at 50000 characters" in marker and "read_skill_file" in marker
    assert any("instructions truncated to 50000" in w for w in skill.warnings)


def test_cut_instructions_end_at_a_word_with_a_marker(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "wordy", body="alpha beta gamma " * 5000)
    skill = AgentSkill(directory, settings=Settings(skills={"max_instructions_chars": 1000}))
    kept = skill.instructions.split("\n\n[... instructions cut here", 1)[0]
    assert len(kept) <= 1000 and kept.split()[-1] in ("alpha", "beta", "gamma")


def test_spec_rules_are_warnings_on_load(tmp_path: Path) -> None:
    long_description = "word " * 260
    directory = write_skill(tmp_path, "Check_Style", long_description, folder="check-style",
                            extra=f"compatibility: {'c' * 600}")
    skill = AgentSkill(directory)
    text = "\n".join(skill.warnings)
    assert "should be lowercase letters" in text
    assert "does not match the directory name 'check-style'" in text
    assert "description is" in text and "limit is 1024" in text
    assert "compatibility is 600 characters" in text


def test_name_too_long_warns(tmp_path: Path) -> None:
    name = "a" * 65
    skill = AgentSkill(write_skill(tmp_path, name))
    assert any("name is 65 characters" in w for w in skill.warnings)


def test_capability_keys_are_known_keys(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "caps", extra="""
        fs_read: [data]
        fs_write: out
        network: yes
        timeout: 5
        trust: core
        env: [A_VAR]
        secrets: [A_TOKEN]
    """)
    skill = AgentSkill(directory)
    assert skill.warnings == []
    caps = skill.capabilities
    assert caps.fs_read == ("data",) and caps.fs_write == ("out",)
    assert caps.network is True and caps.timeout == 5 and caps.trust == "core"
    assert dict(caps.env) == {"A_VAR": None} and caps.secrets == ("A_TOKEN",)


def test_validate_strict_turns_warnings_into_errors(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "Bad_Name", folder="other")
    skill, issues = validate(directory)
    assert skill is not None and issues and all(i.level == "warning" for i in issues)
    _, strict = validate(directory, strict=True)
    assert any(i.level == "error" and "does not match the directory name" in i.message for i in strict)
    good = write_skill(tmp_path, "good-one")
    _, none = validate(good, strict=True)
    assert [i for i in none if i.level == "error"] == []


def test_validate_reports_load_errors(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "nodesc", description=None)
    skill, issues = validate(directory)
    assert skill is None
    assert issues[0].level == "error" and "missing 'description'" in issues[0].message


# --- scripts listing ----------------------------------------------------------------------


def test_scripts_are_lazy_sorted_and_safe(tmp_path: Path) -> None:
    outside = tmp_path / "evil.sh"
    outside.write_text("#!/bin/sh\necho evil\n")
    directory = write_skill(tmp_path / "root", "scripted", scripts={
        "b.py": "print('b')\n", "a.sh": "echo a\n", "notes.md": "not a script\n", ".hidden": "x\n",
    })
    (directory / "scripts" / "escape.sh").symlink_to(outside)
    (directory / "scripts" / "sub").mkdir()
    skill = AgentSkill(directory)
    assert [p.name for p in skill.scripts] == ["a.sh", "b.py"]
    assert any("escape.sh resolves to" in w and "outside the skill directory" in w for w in skill.warnings)


def test_script_limit(tmp_path: Path) -> None:
    scripts = {f"s{i:02d}.sh": f"# script {i}\necho {i}\n" for i in range(12)}
    directory = write_skill(tmp_path, "many", scripts=scripts)
    skill = AgentSkill(directory)
    tools = skill.script_tools(Capabilities())
    assert len(tools) == 10
    assert [t.name for t in tools][:2] == ["many__s00", "many__s01"]
    assert any("only the first 10 become tools" in w for w in skill.warnings)


# --- Capabilities --------------------------------------------------------------------------


def test_capabilities_normalise_bad_values() -> None:
    caps = Capabilities(fs_read="one", network="no", timeout=-3, trust="root", env={"LD_PRELOAD": "x", "OK": 1})
    assert caps.fs_read == ("one",)
    assert caps.network is False
    assert caps.timeout == 60
    assert caps.trust == "external"
    assert dict(caps.env) == {"OK": "1"}
    assert Capabilities.from_front_matter(None) == Capabilities()
    assert Capabilities(timeout="abc").timeout == 60


def test_intersect_paths_network_timeout_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    declared = Capabilities(
        fs_read=["data/sub", "/etc", str(tmp_path / "data-other"), "~/private"],
        fs_write=["out", "data"],
        network=True,
        timeout=120,
        trust="core",
    )
    ceiling = Capabilities(fs_read=["data", "~"], fs_write=["out"], network=False, timeout=30, trust="core")
    grant = declared.intersect(ceiling)
    home = os.path.realpath(os.path.expanduser("~"))
    assert grant.fs_read == (str(tmp_path / "data" / "sub"), os.path.join(home, "private"))
    assert grant.fs_write == (str(tmp_path / "out"),)
    assert grant.network is False
    assert grant.timeout == 30
    assert grant.trust == "core"
    assert declared.denied(grant)["fs_read"] == sorted(["/etc", str(tmp_path / "data-other")])
    both = Capabilities(network=True).intersect(Capabilities(network=True))
    assert both.network is True
    # core trust needs the ceiling (the operator) to have it too; SKILL.md alone only asks
    assert declared.intersect(Capabilities()).trust == "external"
    assert declared.denied(declared.intersect(Capabilities()))["trust"] == "core"


def test_intersect_follows_symlinks_out_of_the_ceiling(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "link").symlink_to("/etc")
    grant = Capabilities(fs_read=[str(allowed / "link"), str(allowed)]).intersect(Capabilities(fs_read=[str(allowed)]))
    assert grant.fs_read == (str(allowed),)


def test_ceiling_from_settings() -> None:
    ceiling = Capabilities.ceiling(SandboxSettings(fs_read=["/data"], network=True, timeout=7))
    assert ceiling.fs_read == ("/data",) and ceiling.network and ceiling.timeout == 7
    assert Capabilities.ceiling().fs_read == ()  # the worker's cwd is not readable by default


# --- catalog ---------------------------------------------------------------------------------


def test_catalog_skips_bad_bundles_and_loads_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    write_skill(root, "good-a")
    write_skill(root, "good-b")
    (root / "no-front").mkdir()
    (root / "no-front" / "SKILL.md").write_text("just text\n")
    write_skill(root, "no-desc", description=None)
    (root / "bad-yaml").mkdir()
    (root / "bad-yaml" / "SKILL.md").write_text("---\nname: bad-yaml\ndescription: [x\n---\n")
    (root / "binary").mkdir()
    (root / "binary" / "SKILL.md").write_bytes(b"\x00\x01\x02" * 100)
    write_skill(root, "mismatch", folder="other-dir")
    outside = tmp_path / "elsewhere.md"
    outside.write_text("---\nname: sneaky\ndescription: d\n---\n")
    (root / "sneaky").mkdir()
    (root / "sneaky" / "SKILL.md").symlink_to(outside)
    write_skill(root, "huge", body="y" * (10 * 1024 * 1024))
    (root / "not-a-skill").mkdir()
    (root / "README.md").write_text("a file in the root\n")

    catalog = SkillCatalog([root])
    assert sorted(catalog.names()) == ["good-a", "good-b", "huge", "mismatch"]
    problems = {p.path.name: p.message for p in catalog.problems}
    assert set(problems) == {"no-front", "no-desc", "bad-yaml", "binary", "sneaky"}
    assert "no YAML front matter" in problems["no-front"]
    assert "missing 'description'" in problems["no-desc"]
    assert "bad-yaml/SKILL.md:4: malformed YAML" in problems["bad-yaml"]
    assert "flow sequence (started on line 3)" in problems["bad-yaml"]
    assert "not a text file" in problems["binary"]
    assert "outside the skill directory" in problems["sneaky"]
    mismatch = catalog.find("mismatch")
    assert mismatch is not None and any("does not match the directory name" in w for w in mismatch.warnings)
    huge = catalog.find("huge")
    assert huge is not None and huge.instructions.startswith("y" * 50_000 + "\n\n[... instructions cut here")


def test_catalog_find_by_front_matter_name_and_folded(tmp_path: Path) -> None:
    write_skill(tmp_path, "check-style", folder="dir-name-differs")
    catalog = SkillCatalog([tmp_path])
    assert catalog.find("check-style") is not None
    assert catalog.find("check_style") is catalog.find("check-style")
    assert catalog.find("dir-name-differs") is None
    assert catalog.find("nope") is None
    assert "check-style" in catalog and len(catalog) == 1
    with pytest.raises(ConfigurationError, match="no skill named 'nope' \\(available: check-style\\)"):
        catalog.get("nope")
    assert [s.name for s in catalog.select(["template-skill", "check_style"])] == ["check-style"]


def test_missing_root_is_empty_and_construction_does_no_io(tmp_path: Path) -> None:
    catalog = SkillCatalog([tmp_path / "absent"])
    assert catalog._loaded is False
    assert catalog.all() == [] and catalog.problems == []


def test_duplicate_names_first_root_wins(tmp_path: Path) -> None:
    first = write_skill(tmp_path / "one", "dup", "from one")
    write_skill(tmp_path / "two", "dup", "from two")
    catalog = SkillCatalog([Root(tmp_path / "one", "user"), Root(tmp_path / "two", "project")])
    skill = catalog.find("dup")
    assert skill is not None and skill.description == "from one" and skill.path == first.resolve()
    assert skill.root == "user"
    assert len(catalog.problems) == 1 and "duplicate skill name 'dup'" in catalog.problems[0].message


def test_default_roots_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(os.environ["HOME"])
    monkeypatch.chdir(tmp_path)
    extra = tmp_path / "extra-root"
    write_skill(home / ".prompts" / "skills", "shared", "from user root")
    write_skill(tmp_path / ".robot_lab" / "skills", "shared", "from project root")
    write_skill(tmp_path / ".robot_lab" / "skills", "project-only")
    write_skill(extra, "settings-only")
    settings = Settings(skills={"roots": [str(extra)]})
    roots = default_roots(settings, entry_points=False)
    assert [r.label for r in roots] == ["user", "project", "settings"]
    assert roots[0].path == home / ".prompts" / "skills"
    catalog = SkillCatalog(roots)
    assert catalog.find("shared").description == "from user root"
    assert catalog.find("project-only").root == "project"
    assert catalog.find("settings-only").root == "settings"


def test_entry_point_skill_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    package = site / "acme_skills"
    write_skill(package / "skills", "acme-report", "Write the ACME quarterly report.")
    (package / "__init__.py").write_text("")
    write_skill(tmp_path / "fn-root", "from-callable")
    (site / "acme_paths.py").write_text(f"def roots():\n    return [{str(tmp_path / 'fn-root')!r}]\n")
    dist = site / "acme_skills-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-skills\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[robot_lab.skills]\nacme = acme_skills\nfn = acme_paths:roots\nbroken = acme_missing_module\n"
    )
    monkeypatch.syspath_prepend(str(site))
    settings = Settings()
    roots = default_roots(settings)
    labels = [r.label for r in roots]
    assert "entry-point:acme" in labels and "entry-point:fn" in labels
    assert "entry-point:broken" not in labels  # warned and skipped
    catalog = SkillCatalog(roots)
    assert catalog.find("acme-report").root == "entry-point:acme"
    assert catalog.find("from-callable").root == "entry-point:fn"
    sys.modules.pop("acme_skills", None)
    sys.modules.pop("acme_paths", None)


def test_catalog_scan_is_once_and_thread_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(20):
        write_skill(tmp_path, f"s{i}")
    catalog = SkillCatalog([tmp_path])
    scans = []
    original = catalog._scan

    def counting_scan() -> None:
        scans.append(1)
        original()

    monkeypatch.setattr(catalog, "_scan", counting_scan)
    results: list[Any] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(len(catalog.all()))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [20] * 8
    assert len(scans) == 1
    write_skill(tmp_path, "late")
    assert catalog.find("late") is None  # no rescan by itself
    catalog.reload()
    assert catalog.find("late") is not None
