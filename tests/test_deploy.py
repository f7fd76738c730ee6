"""deploy/: the Kubernetes manifests, the compose file and the Dockerfile, checked offline.

Every YAML document parses and has apiVersion/kind/metadata.name; each robot of the demo app
has a worker Deployment (image, requests, probes that run a real `robot-lab health`, grace
period >= the task timeout) and a KEDA ScaledObject whose triggers name its real rq queue
key and bus stream / consumer group; Redis persists with AOF. There is no Docker engine and
no Kubernetes API server here: the Dockerfile is parsed, the kustomization is built with
`kubectl kustomize` when kubectl exists.
"""

from __future__ import annotations

import json

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.redis_server import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
BASE = DEPLOY / "k8s" / "base"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _manifests() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [{**d, "_file": str(path.relative_to(REPO_ROOT))} for d in _docs(path)]
    return docs


def _demo_robots() -> list[str]:
    from robot_lab.demo import app

    return sorted(app._robots)


def _by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _manifests() if d["kind"] == kind}


def _pod_specs() -> list[tuple[str, dict]]:
    out = []
    for doc in _manifests():
        spec = doc.get("spec", {})
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            out.append((doc["metadata"]["name"], spec["template"]["spec"]))
        elif doc["kind"] == "CronJob":
            out.append((doc["metadata"]["name"], spec["jobTemplate"]["spec"]["template"]["spec"]))
    return out


def test_every_document_has_the_required_fields():
    docs = _manifests()
    assert len(docs) >= 10
    for doc in docs:
        where = doc["_file"]
        assert isinstance(doc.get("apiVersion"), str) and "/" in doc["apiVersion"] or doc["apiVersion"] == "v1", where
        assert isinstance(doc.get("kind"), str), where
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), where


def test_every_container_has_an_image_requests_and_a_non_root_pod():
    for name, pod in _pod_specs():
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            assert container["image"], name
            requests = container["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), name
            assert container["resources"]["limits"]["memory"], name


def test_each_demo_robot_has_a_worker_deployment_with_meaningful_probes():
    from robot_lab.network.enqueue import DEFAULT_JOB_TIMEOUT

    deployments = _by_kind("Deployment")
    for robot in _demo_robots():
        dep = deployments[f"robot-{robot}"]
        pod = dep["spec"]["template"]["spec"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        assert pod["terminationGracePeriodSeconds"] >= DEFAULT_JOB_TIMEOUT
        [container] = pod["containers"]
        assert container["args"][:2] == ["worker", robot]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            command = container[probe]["exec"]["command"]
            assert command[:2] == ["robot-lab", "health"], (robot, probe)
            # the probe is a real command line: usage errors exit 2, health answers 0 or 1
            result = CliRunner().invoke(__import__("robot_lab.cli", fromlist=["main"]).main, command[1:])
            assert result.exit_code in (0, 1), result.output
        assert "--ready" in container["readinessProbe"]["exec"]["command"]
        refs = {e.get("configMapRef", e.get("secretRef", {})).get("name") for e in container["envFrom"]}
        assert {"robot-lab-config", f"robot-lab-redis-{robot}"} <= refs  # its own Redis ACL user


def test_each_worker_pod_serves_its_metrics_on_the_pod_address_at_a_named_port():
    """A worker's --metrics-port listens on loopback unless --metrics-addr widens it; in a pod
    Prometheus scrapes the pod's address, so each worker Deployment passes 0.0.0.0 and names
    the port it serves (real `robot-lab worker` arguments: a usage error raises here)."""
    from robot_lab.commands.worker import worker

    for robot in _demo_robots():
        pod = _by_kind("Deployment")[f"robot-{robot}"]["spec"]["template"]
        [container] = pod["spec"]["containers"]
        params = worker.make_context("worker", list(container["args"][1:])).params
        assert params["metrics_addr"] == "0.0.0.0", robot
        [port] = [p for p in container["ports"] if p["name"] == "metrics"]
        assert port["containerPort"] == params["metrics_port"], robot
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(params["metrics_port"])

def test_each_robot_logs_in_as_its_own_redis_user_created_by_the_acl_job():
    """redis-users.yaml: a Secret per robot whose REDIS_URL names rl-worker-<robot> with the
    password the robot-lab-acl Job gives that user; the Job runs `robot-lab acl --apply` for
    the same users `robot-lab acl` lists."""
    from urllib.parse import urlsplit

    secrets = {d["metadata"]["name"]: d["stringData"] for d in _manifests() if d["kind"] == "Secret"}
    [job] = [d for d in _manifests() if d["kind"] == "Job" and d["metadata"]["name"] == "robot-lab-acl"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["acl", "--apply"]
    password_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    listed = CliRunner().invoke(__import__("robot_lab.cli", fromlist=["main"]).main, ["acl", "--json",
                                                                                     *container["args"][2:]])
    users = __import__("json").loads(listed.output)["users"]
    assert {u["subject"] for u in users if u["role"] == "worker"} == set(_demo_robots())
    for user in users:
        ref = password_refs[user["password_env"]]
        data = secrets[ref["name"]]
        url = urlsplit(data["REDIS_URL"])
        assert url.username == user["user"] and url.password == data[ref["key"]]


def test_signing_keys_are_mounted_from_an_optional_secret():
    for robot in _demo_robots():
        pod = _by_kind("Deployment")[f"robot-{robot}"]["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "signing-keys"]
        assert env["ROBOT_LAB_SIGNING__KEYS_DIR"] == mount["mountPath"] and mount["readOnly"]
        [volume] = [v for v in pod["volumes"] if v["name"] == "signing-keys"]
        assert volume["secret"]["optional"] is True


def test_each_demo_robot_scales_on_its_queue_and_its_bus_lag():
    from rq import Queue

    from robot_lab.keys import Keys
    from robot_lab.network.enqueue import queue_name

    prefix = _by_kind("ConfigMap")["robot-lab-config"]["data"]["ROBOT_LAB_KEY_PREFIX"]
    auths = _by_kind("TriggerAuthentication")
    scaled = _by_kind("ScaledObject")
    deployments = _by_kind("Deployment")
    import fakeredis

    conn = fakeredis.FakeRedis()
    for robot in _demo_robots():
        obj = scaled[f"robot-{robot}"]
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
        assert obj["spec"]["minReplicaCount"] >= 0 and obj["spec"]["maxReplicaCount"] > obj["spec"]["minReplicaCount"]
        triggers = {t["type"]: t for t in obj["spec"]["triggers"]}
        assert set(triggers) == {"redis", "redis-streams"}
        assert triggers["redis"]["metadata"]["listName"] == Queue(queue_name(robot), connection=conn).key
        assert triggers["redis-streams"]["metadata"]["stream"] == Keys(prefix).inbox(robot)
        assert triggers["redis-streams"]["metadata"]["consumerGroup"] == robot
        for trigger in triggers.values():
            assert trigger["authenticationRef"]["name"] in auths


def test_queue_trigger_names_the_list_rq_really_uses(redis_client):
    """KEDA's redis scaler runs LLEN on listName: the rq queue must be that list."""
    from rq import Queue

    name = f"deploy-check-{uuid.uuid4().hex[:8]}"
    queue = Queue(f"robot:{name}", connection=redis_client)
    try:
        queue.enqueue_call("os.getcwd")
        assert redis_client.type(f"rq:queue:robot:{name}") == b"list"
        assert redis_client.llen(f"rq:queue:robot:{name}") == 1
    finally:
        queue.delete(delete_jobs=True)


def test_redis_statefulset_persists_with_aof():
    sts = _by_kind("StatefulSet")["redis"]
    [container] = sts["spec"]["template"]["spec"]["containers"]
    args = " ".join(container["args"])
    assert "--appendonly yes" in args and "--appendfsync everysec" in args
    assert "--maxmemory-policy noeviction" in args
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert container["volumeMounts"][0] == {"name": "data", "mountPath": "/data"}


def test_submit_job_and_cronjob_run_a_resolvable_network():
    from robot_lab.commands.run import resolve_target

    jobs = [d for d in _manifests() if d["kind"] in ("Job", "CronJob")]
    assert {d["kind"] for d in jobs} == {"Job", "CronJob"}
    for name, pod in _pod_specs():
        args = pod["containers"][0].get("args", [])
        if args[:1] == ["run"]:
            assert resolve_target(args[1]).name == "support"


def test_kustomization_lists_existing_files_and_builds():
    for kustomization in (DEPLOY / "k8s").rglob("kustomization.yaml"):
        data = yaml.safe_load(kustomization.read_text())
        for resource in data.get("resources", []):
            assert (kustomization.parent / resource).exists(), (kustomization, resource)
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed: `kubectl kustomize deploy/k8s/base` not checked")
    built = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(built.stdout) if d]
    assert kinds.count("ScaledObject") == len(_demo_robots())
    assert kinds.count("Deployment") == len(_demo_robots()) + 1  # + the A2A tier
    external = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / "external-redis")],
                              capture_output=True, text=True, timeout=60)
    assert external.returncode == 0, external.stderr
    ext = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(external.stdout) if d]
    assert ("StatefulSet", "redis") not in ext and not [d for d in ext if d[0] == "Secret"]
    assert ("Deployment", "robot-billing") in ext


def test_a2a_tier_is_a_deployment_behind_a_service_with_real_probes_and_tokens():
    """deploy/k8s/base/a2a.yaml: `robot-lab a2a` with arguments the real command accepts,
    probes on its /healthz, tokens from a Secret directory, and a Service that selects its
    pods and reaches its port."""
    from robot_lab.commands.a2a import a2a

    dep = _by_kind("Deployment")["robot-lab-a2a"]
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["replicas"] >= 2  # stateless: any replica serves any task
    [container] = pod["containers"]
    assert container["args"][0] == "a2a"
    ctx = a2a.make_context("a2a", list(container["args"][1:]))  # a usage error raises here
    assert ctx.params["host"] == "0.0.0.0" and ctx.params["app_path"] == "robot_lab.demo:app"
    assert not ctx.params["anonymous"]
    [port] = container["ports"]
    assert port["containerPort"] == ctx.params["port"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "a2a-tokens"]
    assert env["ROBOT_LAB_A2A__TOKENS_DIR"] == mount["mountPath"] and mount["readOnly"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "a2a-tokens"]
    assert "optional" not in volume["secret"]  # no tokens, no pod: never an open server
    service = _by_kind("Service")["robot-lab-a2a"]
    assert service["spec"]["selector"].items() <= labels.items()
    [sport] = service["spec"]["ports"]
    assert sport["targetPort"] == port["name"] and sport["port"] == ctx.params["port"]
    assert ctx.params["public_url"] == f"http://{service['metadata']['name']}:{sport['port']}"
    tokens = _by_kind("Secret")[volume["secret"]["secretName"]]
    assert tokens["stringData"]


def test_generated_files_are_current():
    done = subprocess.run([str(Path(__import__("sys").executable)), str(REPO_ROOT / "scripts" / "gen_deploy.py"),
                           "--check"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr


def test_compose_file_runs_redis_with_aof_and_every_robot():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert "--appendonly" in services["redis"]["command"] and "everysec" in services["redis"]["command"]
    for robot in _demo_robots():
        service = services[robot]
        assert service["command"][:2] == ["worker", robot]
        assert service["environment"]["REDIS_URL"].startswith(f"redis://rl-worker-{robot}:")  # its ACL user
        assert service["environment"]["REDIS_URL"].endswith("@redis:6379/0")
        assert service["healthcheck"]["test"][1:3] == ["robot-lab", "health"]
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["depends_on"]["acl"]["condition"] == "service_completed_successfully"
    assert services["acl"]["command"][:2] == ["acl", "--apply"]
    assert "--requirepass" in services["redis"]["command"]


def _stages(text: str) -> list[dict]:
    """Split a Dockerfile into stages: [{'from': ..., 'name': ..., 'lines': [...]}]."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[dict] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        if instr.upper() == "FROM":
            match = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            stages.append({"from": match.group(1), "name": match.group(2), "lines": []})
        else:
            stages[-1]["lines"].append((instr.upper(), rest.strip()))
    return stages


def test_dockerfile_is_multi_stage_slim_non_root_with_healthcheck():
    stages = _stages((DEPLOY / "Dockerfile").read_text())
    assert len(stages) >= 2 and all(s["name"] for s in stages)
    final = stages[-1]
    assert "slim" in final["from"]
    instrs = dict(final["lines"][::-1])  # first occurrence wins
    user = [rest for instr, rest in final["lines"] if instr == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert "robot-lab" in instrs["HEALTHCHECK"] and "health" in instrs["HEALTHCHECK"]
    entrypoint = json.loads(instrs["ENTRYPOINT"])  # exec form: SIGTERM reaches robot-lab
    assert entrypoint[:3] == ["/usr/bin/tini", "--", "robot-lab"]  # an init that reaps orphans
    assert "tini" in instrs["RUN"]
    final_text = " ".join(rest for _, rest in final["lines"])
    assert "build-essential" not in final_text and "gcc" not in final_text
    assert any(instr == "COPY" and rest.startswith(f"--from={stages[0]['name']}") for instr, rest in final["lines"])
    assert "build-essential" in " ".join(rest for _, rest in stages[0]["lines"])
