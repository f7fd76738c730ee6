"""``robot-lab skills validate --spec`` against skills-ref (the agentskills.io reference
validator), and the lenient loader's handling of what the spec refuses: duplicate keys,
lowercase ``skill.md``, robot-lab's own keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from robot_lab.cli import main
from robot_lab.skills.catalog import SkillCatalog
from robot_lab.skills.skill import validate

CORPUS = Path(__file__).parent / "fixtures" / "skills_spec"
BUNDLES = sorted(p for p in CORPUS.iterdir() if p.is_dir())


def _spec_verdicts(*paths: Path) -> dict[str, bool]:
    result = CliRunner().invoke(main, ["skills", "validate", "--spec", "--json", *map(str, paths)])
    assert result.exit_code in (0, 1), result.output
    return {bundle["path"]: bundle["ok"] for bundle in json.loads(result.stdout)["bundles"]}


def _reference_verdict(bundle: Path) -> bool:
    from skills_ref.validator import validate as reference

    try:
        return not reference(bundle)
    except Exception:  # skills-ref raises on a non-UTF-8 SKILL.md: its CLI fails, so invalid
        return False


def test_spec_agrees_with_skills_ref_on_every_bundle() -> None:
    pytest.importorskip("skills_ref", reason="skills-ref (the reference validator) is not installed")
    ours = _spec_verdicts(*BUNDLES)
    assert set(ours) == {str(b) for b in BUNDLES}
    disagreements = {b.name: (ours[str(b)], _reference_verdict(b)) for b in BUNDLES
                     if ours[str(b)] != _reference_verdict(b)}
    assert disagreements == {}, "bundle: (robot-lab --spec, skills-ref)"
    # the corpus holds both verdicts, so agreement is not trivially all-valid or all-invalid
    assert 5 <= sum(ours.values()) <= len(BUNDLES) - 20


def test_spec_verdicts_on_named_cases() -> None:
    """Without skills-ref installed, the verdicts it gives (checked above) still hold."""
    ours = {Path(path).name: ok for path, ok in _spec_verdicts(*BUNDLES).items()}
    for valid in ("valid-basic", "valid-full", "lowercase-file", "données", "123", "crlf", "description-1024"):
        assert ours[valid] is True, valid
    for invalid in ("missing-name", "folder-differs", "Uppercase-Name", "description-1025", "unknown-key",
                    "duplicate-name", "robot-lab-keys", "non-utf8", "bom", "flow-list", "no-skill-file"):
        assert ours[invalid] is False, invalid


def test_spec_refuses_robot_lab_keys_that_strict_accepts() -> None:
    bundle = CORPUS / "robot-lab-keys"
    strict = CliRunner().invoke(main, ["skills", "validate", "--strict", str(bundle)])
    assert strict.exit_code == 0, strict.output  # --strict keeps its meaning: robot-lab's keys are fine
    spec = CliRunner().invoke(main, ["skills", "validate", "--spec", str(bundle)])
    assert spec.exit_code == 1
    assert "FAIL" in spec.output and "network, timeout" in spec.output
    both = CliRunner().invoke(main, ["skills", "validate", "--spec", "--strict", str(bundle)])
    assert both.exit_code == 2 and "give one" in both.output


def test_duplicate_key_is_named_and_strict_refuses_it() -> None:
    bundle = CORPUS / "duplicate-description"
    skill, issues = validate(bundle)
    assert skill is not None and skill.description == "Second."  # lenient: loads, the last value wins
    warned = [i for i in issues if "'description' is given more than once" in i.message]
    assert warned and warned[0].level == "warning"
    _, strict = validate(bundle, strict=True)
    assert any(i.level == "error" and "'description' is given more than once" in i.message for i in strict)
    nested, _ = validate(CORPUS / "duplicate-metadata-key")
    assert nested is not None and any("'a' is given more than once" in w for w in nested.warnings)


def test_lowercase_skill_md_is_listed_as_skipped(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    shutil.copytree(CORPUS / "lowercase-file", root / "lowercase-file")
    shutil.copytree(CORPUS / "valid-basic", root / "valid-basic")
    catalog = SkillCatalog([root], entry_points=False)
    assert catalog.names() == ["valid-basic"]
    [problem] = catalog.problems
    assert problem.path == root / "lowercase-file" and "rename it to SKILL.md" in problem.message
    listed = CliRunner().invoke(main, ["skills", "list", "--root", str(root)], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert f"skipped {root / 'lowercase-file'}" in listed.output and "skill.md" in listed.output
    as_json = json.loads(CliRunner().invoke(main, ["skills", "list", "--root", str(root), "--json"]).stdout)
    assert any(s["path"] == str(root / "lowercase-file") and "rename it" in s["error"] for s in as_json["skipped"])
    # validate (lenient) names the fix too; --spec accepts it, as skills-ref does, with a note
    lenient = CliRunner().invoke(main, ["skills", "validate", str(root / "lowercase-file")])
    assert lenient.exit_code == 1 and "rename it to SKILL.md" in lenient.output
    spec = CliRunner().invoke(main, ["skills", "validate", "--spec", str(root)])
    assert spec.exit_code == 0 and "robot-lab skips this bundle" in spec.output
