"""deploy/: the KubeRay manifests against the operator's CRD schemas, and what they run.

No API server runs here, so the RayJob/RayCluster documents are validated with `jsonschema`
against `openAPIV3Schema` from ../shared/kuberay-crds, made as strict as Kubernetes is: a field
the schema does not name is an error (kubectl rejects it; the API server alone prunes it), as are
duplicate keys in `x-kubernetes-list-type: map` lists. CEL rules (`x-kubernetes-validations`)
cannot be evaluated offline; a manifest that sets a field carrying one fails, so it gets checked
by hand.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from horizonrl.cluster.config import load_config

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "deploy" / "kuberay"
CRD_DIR = ROOT.parent / "shared" / "kuberay-crds"
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
# Settings of the private 127.0.0.1 Ray (cluster/ops/runtime.py) that must not reach a real cluster.
LOOPBACK_ONLY_ENV = {"GLOO_SOCKET_IFNAME", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE"}
# The CRD leaves the top-level metadata to the API server (ObjectMeta); this is the part we use.
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "properties": {
        # KubeRay derives Service names from it: a DNS-1035 label, with room for suffixes.
        "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 47},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader reads a 1 MB CRD in 0.3 s


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=Loader) if d]


MANIFESTS = {f"{p.name}:{d['kind']}": d for p in sorted(KUBERAY.glob("*.yaml"))
             for d in _documents(p)}
RAY_OBJECTS = {k: d for k, d in MANIFESTS.items() if d["kind"] in CRD_FILES}
RAY_JOBS = {k: d for k, d in RAY_OBJECTS.items() if d["kind"] == "RayJob"}


# --- a validator with Kubernetes' structural-schema rules ---------------------------------------

_BASE = jsonschema.Draft7Validator.VALIDATORS


def _unknown(keys: Any, schema: dict[str, Any]) -> Iterator[jsonschema.ValidationError]:
    if "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    for key in sorted(keys):
        yield jsonschema.ValidationError(
            f"unknown field {key!r} (kubectl's strict validation rejects it; the API server "
            "alone would drop it)", path=[key])


def _properties(validator, properties, instance, schema):
    yield from _BASE["properties"](validator, properties, instance, schema)
    if validator.is_type(instance, "object"):
        yield from _unknown(instance.keys() - properties.keys(), schema)


def _type(validator, types, instance, schema):
    if instance is None and schema.get("nullable"):
        return
    yield from _BASE["type"](validator, types, instance, schema)
    if types == "object" and "properties" not in schema and validator.is_type(instance, "object"):
        yield from _unknown(instance.keys(), schema)  # no properties at all: everything is pruned


def _required(validator, required, instance, schema):
    # Defaults are applied before `required` is checked (e.g. a worker group's maxReplicas).
    props = schema.get("properties", {})
    still = [r for r in required if "default" not in props.get(r, {})]
    yield from _BASE["required"](validator, still, instance, schema)


def _int_or_string(validator, on, instance, schema):
    if on and "anyOf" not in schema and (isinstance(instance, bool)
                                         or not isinstance(instance, int | str)):
        yield jsonschema.ValidationError(f"{instance!r} is neither an integer nor a string")


def _list_type(validator, kind, instance, schema):
    if kind not in ("map", "set") or not validator.is_type(instance, "array"):
        return
    if kind == "set":
        keys = [repr(item) for item in instance]
    else:
        names = schema.get("x-kubernetes-list-map-keys", [])
        props = schema.get("items", {}).get("properties", {})
        keys = [repr(tuple(item.get(n, props.get(n, {}).get("default")) for n in names))
                for item in instance if isinstance(item, dict)]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        yield jsonschema.ValidationError(f"duplicate entries {dupes} in a list-type {kind}")


def _cel(validator, rules, instance, schema):
    for rule in rules:
        if "oldSelf" not in rule["rule"]:  # transition rules only apply to updates
            yield jsonschema.ValidationError(
                f"CEL rule not checked offline: {rule['rule']} ({rule.get('message', '')})")


_formats = jsonschema.FormatChecker(formats=())


@_formats.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_formats.checks("int64")
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


StructuralValidator = jsonschema.validators.extend(jsonschema.Draft7Validator, {
    "properties": _properties,
    "type": _type,
    "required": _required,
    "x-kubernetes-int-or-string": _int_or_string,
    "x-kubernetes-list-type": _list_type,
    "x-kubernetes-validations": _cel,
})


@pytest.fixture(scope="module")
def validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(kind, version) -> a validator for the whole object; the CRDs are read once."""
    if not CRD_DIR.is_dir():
        pytest.skip(f"KubeRay CRDs not found at {CRD_DIR} (they sit beside the repo, in "
                    "shared/kuberay-crds); the manifests cannot be schema-checked")
    out = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.load((CRD_DIR / name).read_text(), Loader=Loader)
        assert crd["spec"]["names"]["kind"] == kind
        for version in crd["spec"]["versions"]:
            if not version.get("served") or version.get("deprecated"):
                continue
            schema = dict(version["schema"]["openAPIV3Schema"])
            schema["properties"] = {**schema["properties"], "metadata": OBJECT_META}
            schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
            out[kind, version["name"]] = StructuralValidator(schema, format_checker=_formats)
    return out


def schema_errors(doc: dict[str, Any], validators) -> list[str]:
    group, _, version = doc.get("apiVersion", "").partition("/")
    validator = validators.get((doc.get("kind"), version))
    if group != "ray.io" or validator is None:
        return [f"apiVersion {doc.get('apiVersion')!r} is not a served, non-deprecated "
                f"version of {doc.get('kind')} (have {sorted(validators)})"]
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))]


def test_deploy_folder_holds_both_kinds():
    assert {d["kind"] for d in RAY_OBJECTS.values()} == {"RayJob", "RayCluster"}


@pytest.mark.parametrize("name", sorted(RAY_OBJECTS))
def test_manifest_matches_crd_schema(name, validators):
    errors = schema_errors(RAY_OBJECTS[name], validators)
    assert not errors, f"{name} fails the KubeRay CRD schema:\n  " + "\n  ".join(errors)


def _cluster(doc):
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def _break_type(doc):  # rayStartParams is map[string]string: a bare 0 is the classic slip
    _cluster(doc)["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0


def _unknown_field(doc):
    _cluster(doc)["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "x"


def _duplicate_port(doc):
    ports = _cluster(doc)["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    ports.append({"name": "again", "containerPort": ports[0]["containerPort"]})


def _bad_quantity(doc):
    _cluster(doc)["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
        "limits"]["memory"] = "12 gigs"


@pytest.mark.parametrize("breakage,needle", [
    (_break_type, "rayStartParams.num-cpus: 0 is not of type 'string'"),
    (_unknown_field, "containers.0.imagePullPolicyy: unknown field"),
    (_duplicate_port, "containers.0.ports: duplicate entries"),
    (_bad_quantity, "limits.memory: '12 gigs' does not match"),
])
@pytest.mark.parametrize("name", ["rayjob.yaml:RayJob", "raycluster.yaml:RayCluster"])
def test_broken_copy_fails(name, breakage, needle, validators):
    doc = copy.deepcopy(RAY_OBJECTS[name])
    breakage(doc)
    errors = schema_errors(doc, validators)
    assert any(needle in e for e in errors), errors


def _train_argv(job: dict[str, Any]) -> list[str]:
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["horizonrl", "train"], argv
    return argv


def _config_file(job: dict[str, Any]) -> Path:
    argv = _train_argv(job)
    assert "--config" in argv, f"entrypoint names no --config file: {argv}"
    return ROOT / argv[argv.index("--config") + 1]


@pytest.mark.parametrize("name", sorted(RAY_JOBS))
def test_entrypoint_config_exists_and_loads(name):
    config = _config_file(RAY_JOBS[name])
    assert config.is_file(), f"{name}: {config} is not in the repository"
    load_config(config)  # the command-line overrides are left out on purpose
    # In a pod the driver must join the cluster and serve /metrics beyond loopback.
    assert {"ray.address=auto", "metrics.host=0.0.0.0"} <= set(_train_argv(RAY_JOBS[name]))


def _cpus(quantity: str | int) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _offers(group: dict[str, Any]) -> dict[str, float]:
    """The custom resources a worker group's pods offer (rayStartParams' quoted JSON)."""
    raw = group.get("rayStartParams", {}).get("resources")
    return json.loads(raw.strip('"').replace('\\"', '"')) if raw else {}


@pytest.mark.parametrize("name", sorted(RAY_JOBS))
def test_worker_groups_hold_the_roles_they_are_chosen_by(name):
    """Every actor of the plan (the figures `train --dry-run` prints) and the driver go to the
    worker group whose custom resources they ask for (the only group, when there is one), and
    each group's guaranteed pods hold what lands on it."""
    from horizonrl.cluster.ops.plan import placement_plan
    from horizonrl.learner.ingest_guard import is_loopback

    job = RAY_JOBS[name]
    cluster = _cluster(job)
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = cluster["workerGroupSpecs"]
    cfg = load_config(_config_file(job))
    if is_loopback(cfg.learner.ingest.host):  # generators dial 127.0.0.1: one pod, no more
        (group,) = groups
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1

    def home(role: str, custom: dict[str, float]) -> str:
        fits = [g["groupName"] for g in groups if custom.keys() <= _offers(g).keys()]
        assert len(fits) == 1, f"{name}: {role} asks for {custom}; groups that offer it: {fits}"
        return fits[0]

    # The driver is scheduled like an actor (off the 0-CPU head) by its reservations.
    assert job["spec"]["entrypointNumCpus"] > 0
    driver = json.loads(job["spec"].get("entrypointResources", "{}"))
    need = {g["groupName"]: {"CPU": 0.0, "GPU": 0.0} for g in groups}
    need[home("the driver", driver)]["CPU"] += job["spec"]["entrypointNumCpus"]
    for role, count, res in placement_plan(cfg):
        if not res.get("CPU") and not res.get("GPU"):
            continue  # the curriculum: 0 CPUs, on the driver's node
        custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU")}
        group = need[home(role, custom)]
        for k in ("CPU", "GPU"):
            group[k] += count * res.get(k, 0.0)
    for g in groups:
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        pods = g["minReplicas"]
        have = {"CPU": pods * _cpus(limits["cpu"]),
                "GPU": pods * float(limits.get("nvidia.com/gpu", 0))}
        short = {k: f"needs {v:g}, {pods} pod(s) have {have[k]:g}"
                 for k, v in need[g["groupName"]].items() if v > have[k] + 1e-9}
        assert not short, f"{name}: group {g['groupName']} is too small: {short}"


def _containers(doc: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template, container) for every Ray pod a RayJob or RayCluster creates."""
    cluster = _cluster(doc)
    for group in [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]:
        for c in group["template"]["spec"]["containers"]:
            yield group["template"], c


def test_podmonitor_scrapes_ports_the_pods_declare():
    monitor = MANIFESTS["podmonitor.yaml:PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    wanted = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert wanted == {"horizonrl", "metrics"}
    for name, doc in RAY_OBJECTS.items():
        declared = {}
        for template, c in _containers(doc):
            labels = template.get("metadata", {}).get("labels", {})
            assert selector.items() <= labels.items(), f"{name}: pod not selected by the monitor"
            declared.update({p.get("name"): p["containerPort"] for p in c.get("ports", [])})
        assert wanted <= declared.keys(), f"{name}: declares {sorted(declared)}, not {wanted}"
        assert declared["metrics"] == 8080  # Ray's metrics export port under KubeRay
        if name in RAY_JOBS:
            port = next(a for a in _train_argv(doc) if a.startswith("metrics.port="))
            assert int(port.split("=")[1]) == declared["horizonrl"], name


def _loopback_env(env_vars: dict[str, str]) -> set[str]:
    return LOOPBACK_ONLY_ENV & set(env_vars)


def test_runtime_env_for_job_submit():
    env = yaml.safe_load((ROOT / "deploy" / "runtime_env.yaml").read_text())
    assert {".venv", ".git", "runs", ".cache", "__pycache__"} <= set(env["excludes"])
    assert "working_dir" not in env  # given by `ray job submit --working-dir .`
    assert not _loopback_env(env.get("env_vars", {}))
    assert all(isinstance(v, str) for v in env.get("env_vars", {}).values())
    for name, job in RAY_JOBS.items():
        inline = yaml.safe_load(job["spec"].get("runtimeEnvYAML", "{}"))
        assert isinstance(inline, dict), name
        assert not _loopback_env(inline.get("env_vars", {})), name
