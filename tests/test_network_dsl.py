"""The network DSL and its validation: no Redis involved, everything fails before a run."""

from __future__ import annotations

import pytest

from robot_lab.app import App
from robot_lab.errors import ConfigurationError
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build


def _support():
    net = create_network("support")
    net.task("classify", build("classifier", model="scripted/route:billing"), routes=["billing", "general"])
    net.task("billing", build("billing", model="scripted/echo"), depends_on="optional")
    net.task("general", build("general", model="scripted/echo"), depends_on="optional")
    with net.parallel("analysis", depends_on=["billing", "general"]):
        net.task("sentiment", "sentiment")
        net.task("urgency", "urgency")
    net.task("summarize", "summarizer", depends_on=["analysis"])
    return net


def test_group_members_inherit_group_dependencies_and_group_expands():
    graph = _support().validate()
    assert graph.deps["sentiment"] == ["billing", "general"]
    assert graph.deps["summarize"] == ["sentiment", "urgency"]
    assert graph.activators == {"billing": ["classify"], "general": ["classify"]}
    assert graph.levels == [["classify"], ["billing", "general"], ["sentiment", "urgency"], ["summarize"]]
    assert graph.final_task_candidates() == ["summarize"]


def test_renderings_name_every_task_and_edge():
    net = _support()
    text = net.visualize()
    assert "Stage 3 (parallel):" in text and "sentiment [sentiment] <- billing, general" in text
    assert "billing [billing] (optional) <- classify (when activated)" in text
    mermaid = net.to_mermaid()
    assert mermaid.startswith("graph TD")
    assert "classify -.->|route| billing" in mermaid and "urgency --> summarize" in mermaid
    assert "subgraph analysis" in mermaid
    dot = net.to_dot()
    assert '"classify" -> "general" [style=dashed, label="route"];' in dot
    assert 'subgraph "cluster_analysis"' in dot and dot.rstrip().endswith("}")
    plan = net.execution_plan()
    assert [[t["name"] for t in stage["tasks"]] for stage in plan] == [
        ["classify"], ["billing", "general"], ["sentiment", "urgency"], ["summarize"]
    ]
    assert plan[1]["tasks"][0]["optional"] and plan[1]["tasks"][0]["activated_by"] == ["classify"]
    assert net.to_dict()["optional_tasks"] == ["billing", "general"]


def test_cycle_is_reported_with_its_path():
    net = create_network("loop")
    net.task("a", "r", depends_on=["c"])
    net.task("b", "r", depends_on=["a"])
    net.task("c", "r", depends_on=["b"])
    with pytest.raises(ConfigurationError, match=r"has a cycle: .*a -> .*b -> .*c|has a cycle"):
        net.validate()


def test_unknown_dependency_names_the_task_and_lists_known_names():
    net = create_network("n")
    net.task("a", "r")
    net.task("b", "r", depends_on=["nope"])
    with pytest.raises(ConfigurationError, match=r"task 'b' depends on unknown task or group 'nope' \(known: a, b\)"):
        net.validate()


@pytest.mark.parametrize(
    "build_net, message",
    [
        (lambda n: n.task("x", "r", depends_on="optional"), "optional task 'x' can never run"),
        (lambda n: (n.task("a", "r", routes=["b"]), n.task("b", "r")), "routes to 'b', which is not optional"),
        (lambda n: n.task("a", "r", routes=["ghost"]), "routes to unknown task 'ghost'"),
        (lambda n: n.task("a", "r", router="not-a-path", routes=["a"]), "must be an import path"),
        (lambda n: n.task("a", "r", depends_on=["a"]), "depends on itself"),
    ],
)
def test_bad_definitions_fail_at_validation(build_net, message):
    net = create_network("n")
    build_net(net)
    with pytest.raises(ConfigurationError, match=message):
        net.validate()


def test_definition_time_errors():
    net = create_network("n")
    net.task("a", "r")
    with pytest.raises(ConfigurationError, match="task 'a' is defined twice"):
        net.task("a", "r")
    with pytest.raises(ConfigurationError, match="task name 'bad name' is invalid"):
        net.task("bad name", "r")
    with pytest.raises(ConfigurationError, match="depends_on must be"):
        net.task("c", "r", depends_on=3)
    with pytest.raises(ConfigurationError, match="robot must be a Robot"):
        net.task("d", object())
    with pytest.raises(ConfigurationError, match="two different robots are named 'x'"):
        net.task("e", build("x"))
        net.task("f", build("x"))
    with pytest.raises(ConfigurationError, match="network name"):
        create_network("a:b")


def test_unimportable_tool_fails_when_the_robot_is_built():
    with pytest.raises(ConfigurationError, match="no_such_module"):
        build("r", local_tools=["no_such_module.tools:lookup"])


def test_yaml_app_defines_robots_and_networks(tmp_path):
    path = tmp_path / "desk.yml"
    path.write_text(
        """
robots:
  - {name: router, model: "scripted/route:b"}
  - {name: worker, model: "scripted/echo", system_prompt: "be brief"}
networks:
  - name: desk
    config: {max_concurrent_robots: 2}
    tasks:
      - {name: route, robot: router, routes: [b]}
      - {name: b, robot: worker, depends_on: optional}
      - {name: last, robot: worker, depends_on: [group1]}
    parallel:
      - name: group1
        depends_on: [b]
        tasks:
          - {name: p1, robot: worker}
          - {name: p2, robot: worker}
"""
    )
    app = App.from_yaml(path)
    assert app.robot_names == ["router", "worker"]
    assert app.robot_spec("worker").system_prompt == "be brief"
    net = app.get_network("desk")
    graph = net.validate()
    assert graph.order.index("last") > graph.order.index("p2")
    assert graph.deps["last"] == ["p1", "p2"] and graph.deps["p1"] == ["b"]
    assert net.config.max_concurrent_robots == 2


def test_yaml_errors_name_the_file_and_entry(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("networks:\n  - name: n\n    tasks:\n      - {name: a, robot: r, colour: red}\n")
    with pytest.raises(ConfigurationError, match=r"bad.yml: networks\[0\].*unknown keys \['colour'\]"):
        App.from_yaml(path)
    path.write_text("robots:\n  - {model: x}\n")
    with pytest.raises(ConfigurationError, match=r"robots\[0\].*name"):
        App.from_yaml(path)


def test_app_registry_and_lookup_errors():
    app = App("a")
    app.robot("one", model="scripted/echo")
    with pytest.raises(ConfigurationError, match="robot 'one' is defined twice"):
        app.robot("one")
    with pytest.raises(ConfigurationError, match=r"has no robot 'two' \(robots: one\)"):
        app.robot_spec("two")
    net = app.network("n")
    assert net.app is app and app.get_network() is net
    with pytest.raises(ConfigurationError, match="has no network 'x'"):
        app.get_network("x")
    fresh = app.build_robot("one")
    assert fresh.name == "one" and fresh.messages == [] or fresh.messages[0]["role"] == "system"
