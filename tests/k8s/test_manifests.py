"""Every overlay renders with `kubectl kustomize`, validates against its schemas and keeps the rules:
same Serve app as configs/, only the gateway exposed, Redis behind passwords from Secrets."""

from __future__ import annotations

import copy
import os

import pytest
import yaml

from scripts.k8s_validate import check, exposure, kuberay, schemas
from scripts.k8s_validate.render import ROOT, overlays, ray_containers, render, the
from specserve.deploy import k8s_render
from specserve.env import DEPLOYMENT_VARIABLES, EnvVar


def test_overlays_are_dev_and_prod():
    assert {"dev", "prod"} <= set(overlays())


def test_every_object_validates(rendered):
    for name, objs in rendered.items():
        kinds = {o["kind"] for o in objs}
        assert {"RayService", "StatefulSet", "Deployment", "Service", "ConfigMap"} <= kinds, name
        problems = [p for o in objs for p in schemas.schema_problems(o)]
        assert problems == [], name


def _rayservice(objs):
    return the(objs, "RayService", "specserve")


@pytest.mark.parametrize(
    "where, bad",
    [
        ("spec.rayClusterConfig", {"enableInTreeAutoscalin": True}),  # misspelt field
        ("spec.rayClusterConfig.workerGroupSpecs.0", {"maxReplicas": "lots"}),
        ("spec.rayClusterConfig.gcsFaultToleranceOptions", {"backend": "etcd"}),
        (
            "spec.rayClusterConfig.headGroupSpec.template.spec.containers.0.resources.limits",
            {"cpu": "two"},
        ),
        ("spec", {"serveService": {"spec": {"type": 7}}}),
    ],
)
def test_broken_rayservice_fails_validation(rendered, where, bad):
    obj = copy.deepcopy(_rayservice(rendered["dev"]))
    node = obj
    for key in where.split("."):
        node = node[int(key)] if isinstance(node, list) else node[key]
    node.update(bad)
    assert schemas.schema_problems(obj)


@pytest.mark.parametrize(
    "kind, name, where, bad",
    [
        ("Service", "specserve-redis-registry", "spec", {"tpye": "ClusterIP"}),
        ("StatefulSet", "specserve-redis-registry", "spec", {"replicas": "one"}),
        ("PersistentVolumeClaim", "specserve-models", "spec", {"accessModes": "ReadWriteOnce"}),
    ],
)
def test_broken_core_object_fails_validation(rendered, kind, name, where, bad):
    obj = copy.deepcopy(the(rendered["dev"], kind, name))
    obj[where].update(bad)
    assert schemas.schema_problems(obj)


def test_broken_overlay_renders_and_fails(kubectl, tmp_path):
    """A real kustomization with a bad patch: it renders, then validation rejects it."""
    base = os.path.relpath(ROOT / "k8s" / "overlays" / "dev", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{base}]\n"
        "patches:\n"
        "  - target: {kind: RayService, name: specserve}\n"
        "    patch: |-\n"
        "      - {op: add, path: /spec/rayClusterConfig/workerGroupSpecs/0/minReplica, value: 0}\n"
    )
    objs = render(tmp_path, kubectl)
    problems = check.problems(objs)
    assert any("minReplica" in p for p in problems), problems


def test_serve_config_in_rayservice_is_configs_serve_yaml(rendered):
    configs = k8s_render.load_yaml(ROOT / "specserve" / "configs" / "serve.yaml")
    dev = yaml.safe_load(_rayservice(rendered["dev"])["spec"]["serveConfigV2"])
    assert dev == configs
    for name, objs in rendered.items():
        serve = yaml.safe_load(_rayservice(objs)["spec"]["serveConfigV2"])
        assert serve == k8s_render.overlay_serve_config(ROOT, name), name
        # overrides resize deployments; the application itself is the same everywhere
        for key in ("proxy_location", "http_options"):
            assert serve[key] == configs[key], (name, key)
        (app,), (want,) = serve["applications"], configs["applications"]
        for key in ("name", "route_prefix", "import_path", "args"):
            assert app[key] == want[key], (name, key)
        assert [d["name"] for d in app["deployments"]] == [d["name"] for d in want["deployments"]]


def test_prod_gives_model_servers_gpus_and_dev_none(rendered):
    prod = yaml.safe_load(_rayservice(rendered["prod"])["spec"]["serveConfigV2"])
    for dep in prod["applications"][0]["deployments"]:
        if dep["name"].startswith("ModelServer-"):
            assert dep["ray_actor_options"]["num_gpus"] == 1
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(rendered["dev"])
    assert "num_gpus" not in _rayservice(rendered["dev"])["spec"]["serveConfigV2"]


def test_cluster_shape(rendered):
    for name, objs in rendered.items():
        cluster = _rayservice(objs)["spec"]["rayClusterConfig"]
        assert cluster["enableInTreeAutoscaling"] is True, name
        assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] > 0, name
        head = cluster["headGroupSpec"]
        assert head["rayStartParams"]["num-cpus"] == "0", name  # no replicas on the head
        head_limits = head["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "nvidia.com/gpu" not in head_limits, name
        for group in cluster["workerGroupSpecs"]:
            assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], name
            assert group["minReplicas"] < group["maxReplicas"], (name, group["groupName"])
        for where, c in ray_containers(_rayservice(objs)).items():
            res = c["resources"]
            assert res["requests"] and res["limits"], (name, where)
    groups = _rayservice(rendered["prod"])["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    gpu = [
        g
        for g in groups
        if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
    ]
    assert len(gpu) == 1 and gpu[0]["maxReplicas"] >= 2
    serve = yaml.safe_load(_rayservice(rendered["prod"])["spec"]["serveConfigV2"])
    (model_server,) = [
        d for d in serve["applications"][0]["deployments"] if d["name"].startswith("ModelServer-")
    ]
    # the autoscaler can place every ModelServer replica the Serve autoscaler may ask for
    assert model_server["autoscaling_config"]["max_replicas"] <= gpu[0]["maxReplicas"]


def test_gateway_probes_and_service(rendered):
    for name, objs in rendered.items():
        rs = _rayservice(objs)
        serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
        assert serve["http_options"]["port"] == 8000  # the port everything below refers to
        assert rs["spec"]["excludeHeadPodFromServeSvc"] is True
        assert rs["spec"]["serveService"]["spec"]["ports"] == [{"name": "serve", "port": 8000}]
        containers = ray_containers(rs)
        assert {"name": "serve", "containerPort": 8000} in containers["head"]["ports"]
        for group, c in containers.items():
            if group == "head":
                continue
            probe = c["readinessProbe"]["httpGet"]
            assert (probe["path"], probe["port"]) == ("/healthz", 8000), (name, group)
            # liveness on the app would restart Ray nodes during redeploys: KubeRay's raylet check
            assert "/healthz" not in str(c.get("livenessProbe", "")), (name, group)


def test_only_the_gateway_is_exposed(rendered):
    for name, objs in rendered.items():
        assert exposure.exposure_problems(objs) == [], name
    ingress = the(rendered["prod"], "Ingress")
    paths = [p["path"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
    assert not any(p.startswith(("/admin", "/metrics")) or p == "/" for p in paths), paths


def _mutated(objs, kind, name, change):
    out = copy.deepcopy(objs)
    change(the(out, kind, name))
    return out


@pytest.mark.parametrize(
    "kind, name, change",
    [
        ("Service", "specserve-redis-pool", lambda o: o["spec"].update(type="LoadBalancer")),
        ("Service", "specserve-redis-registry", lambda o: o["spec"].update(type="NodePort")),
        (
            "RayService",
            "specserve",
            lambda o: o["spec"]["rayClusterConfig"]["headGroupSpec"].update(
                serviceType="LoadBalancer"
            ),
        ),
        (
            "RayService",
            "specserve",
            lambda o: o["spec"]["rayClusterConfig"]["headGroupSpec"].update(enableIngress=True),
        ),
        (
            "RayService",
            "specserve",
            lambda o: o["spec"]["serveService"]["spec"].update(type="NodePort"),
        ),
        (
            "RayService",
            "specserve",
            lambda o: o["spec"]["serveService"]["spec"]["ports"].append(
                {"name": "dashboard", "port": 8265}
            ),
        ),
        (
            "Ingress",
            "specserve-gateway",
            lambda o: o["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].update(
                name="specserve-redis-registry"
            ),
        ),
        (
            "Ingress",
            "specserve-gateway",
            lambda o: o["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].update(
                port={"number": 8265}
            ),
        ),
    ],
)
def test_exposure_check_catches(rendered, kind, name, change):
    assert exposure.exposure_problems(_mutated(rendered["prod"], kind, name, change))


def test_kuberay_operator_rules(rendered):
    for name, objs in rendered.items():
        assert kuberay.kuberay_problems(objs) == [], name


def _head(o):
    return o["spec"]["rayClusterConfig"]["headGroupSpec"]


@pytest.mark.parametrize(
    "change",
    [
        lambda o: _head(o)["template"]["spec"]["containers"][0]["env"].append(
            {"name": "REDIS_PASSWORD", "value": "x"}
        ),
        lambda o: _head(o)["template"]["spec"]["containers"][0]["env"].append(
            {"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}
        ),
        lambda o: _head(o)["rayStartParams"].update({"redis-password": "x"}),
        lambda o: _head(o).update(headService={"metadata": {"name": "h"}}),
        lambda o: o["spec"]["upgradeStrategy"].update(type="Rolling"),
        lambda o: o["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(replicas=9),
        lambda o: o["metadata"].update(name="Specserve"),
    ],
)
def test_kuberay_rules_catch(rendered, change):
    assert kuberay.kuberay_problems(_mutated(rendered["dev"], "RayService", "specserve", change))


def test_redis_needs_passwords_from_secrets(rendered):
    for name, objs in rendered.items():
        assert exposure.secret_problems(objs) == [], name


def _redis_container(o):
    return o["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    "kind, name, change",
    [
        (
            "StatefulSet",
            "specserve-redis-registry",
            lambda o: _redis_container(o).update(args=["exec redis-server /etc/redis/redis.conf"]),
        ),
        (
            "Deployment",
            "specserve-redis-pool",
            lambda o: _redis_container(o)["env"][0].update(value="hunter2", valueFrom=None),
        ),
        (
            "RayService",
            "specserve",
            lambda o: o["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"].update(
                redisPassword={"value": "hunter2"}
            ),
        ),
        (
            "RayService",
            "specserve",
            lambda o: o["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"][
                "containers"
            ][0]["env"].append({"name": "SPECSERVE_ADMIN_TOKEN", "value": "t"}),
        ),
    ],
)
def test_secret_check_catches(rendered, kind, name, change):
    assert exposure.secret_problems(_mutated(rendered["dev"], kind, name, change))


def _redis_conf(objs, key):
    conf = the(objs, "ConfigMap", "specserve-redis-config")["data"][key]
    return dict(
        line.split(None, 1) for line in conf.splitlines() if line and not line.startswith("#")
    )


def test_redis_roles(rendered):
    for name, objs in rendered.items():
        registry = _redis_conf(objs, "registry.conf")
        assert registry["appendonly"] == "yes" and registry["maxmemory-policy"] == "noeviction", (
            name
        )
        assert registry["dir"] == "/data"
        sts = the(objs, "StatefulSet", "specserve-redis-registry")
        assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == ["data"]
        assert {"name": "data", "mountPath": "/data"} in _redis_container(sts)["volumeMounts"]
        pool = _redis_conf(objs, "pool.conf")
        assert pool["maxmemory-policy"] == "allkeys-lru" and pool["maxmemory"] == "256mb", name
        assert pool["appendonly"] == "no", name
        limit = _redis_container(the(objs, "Deployment", "specserve-redis-pool"))["resources"][
            "limits"
        ]["memory"]
        assert limit == "384Mi", name  # above maxmemory: Redis evicts before the kernel kills it
        gcs = _rayservice(objs)["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
        assert gcs["redisAddress"] == "specserve-redis-registry:6379", name


def test_app_environment_and_mounts(rendered):
    """Every Ray container has the same env and mounts, and the env points into the mounts."""
    for name, objs in rendered.items():
        rs = _rayservice(objs)
        containers = ray_containers(rs)
        head = containers["head"]
        for group, c in containers.items():
            for key in ("env", "envFrom", "volumeMounts"):
                assert c[key] == head[key], (name, group, key)
        pod_specs = [rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]]
        pod_specs += [
            g["template"]["spec"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        ]
        volumes = {v["name"]: v for v in pod_specs[0]["volumes"]}
        assert all(s["volumes"] == pod_specs[0]["volumes"] for s in pod_specs), name
        # the ray user (group users, 100) can write the models volume on every node
        assert all(s["securityContext"] == {"fsGroup": 100} for s in pod_specs), name
        mounts = {m["mountPath"]: volumes[m["name"]] for m in head["volumeMounts"]}
        env = the(objs, "ConfigMap", "specserve-env")["data"]
        assert mounts["/data/specserve"]["persistentVolumeClaim"]["claimName"] == "specserve-models"
        assert env["SPECSERVE_CACHE"] == "/data/specserve"
        assert env["SPECSERVE_ADAPTER_ROOT"].startswith("/data/specserve/")
        policy_dir, policy_file = env["SPECSERVE_POLICY_FILE"].rsplit("/", 1)
        policy_cm = the(objs, "ConfigMap", mounts[policy_dir]["configMap"]["name"])
        assert yaml.safe_load(policy_cm["data"][policy_file]) == k8s_render.load_yaml(
            ROOT / "specserve" / "configs" / "policy.yaml"
        )
        tenants_dir, _ = env["SPECSERVE_TENANT_KEYS_FILE"].rsplit("/", 1)
        assert mounts[tenants_dir]["secret"]["secretName"] == "specserve-tenants"
        the(objs, "PersistentVolumeClaim", "specserve-models")
        names = {e["name"] for e in head["env"]}
        assert {"REDIS_URL", "SPECSERVE_POOL_REDIS_URL", "SPECSERVE_ADMIN_TOKEN"} <= names, name


def test_secrets_only_placeholders_in_dev_and_none_in_prod(rendered):
    import base64

    assert not [o for o in rendered["prod"] if o["kind"] == "Secret"]
    secrets = {o["metadata"]["name"]: o for o in rendered["dev"] if o["kind"] == "Secret"}
    assert set(secrets) == {"specserve-admin", "specserve-redis", "specserve-tenants"}
    for secret in secrets.values():
        for value in secret["data"].values():
            text = base64.b64decode(value).decode()
            assert "changeme" in text.replace("-", ""), secret["metadata"]["name"]
    # every Secret the pods refer to exists in dev, under the keys they ask for
    refs = set()
    for c in ray_containers(_rayservice(rendered["dev"])).values():
        refs |= {
            (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in c["env"]
            if "valueFrom" in e
        }
    for name, key in refs:
        assert key in secrets[name]["data"], (name, key)


def test_validate_command_passes_every_overlay(kubectl, capsys):
    assert check.main([]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}: ok" in out for name in overlays())


def _worker(o, index=0):
    return o["spec"]["rayClusterConfig"]["workerGroupSpecs"][index]["template"]["spec"]


def _pre_stop(o, command):
    _worker(o)["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] = command


def _shutdown_timeout(o, seconds):
    serve = yaml.safe_load(o["spec"]["serveConfigV2"])
    serve["applications"][0]["args"]["shutdown_timeout_s"] = seconds
    o["spec"]["serveConfigV2"] = yaml.safe_dump(serve)


def test_workers_drain_before_ray_stops_within_their_grace_period(rendered):
    from specserve.platform.rayserve.drain import CUT_GRACE_S

    assert kuberay.DRAIN_GRACE_S >= CUT_GRACE_S  # the check prices the real grace
    for name, objs in rendered.items():
        assert kuberay.drain_problems(objs) == [], name
        for group in _rayservice(objs)["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            command = group["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]
            assert "specserve drain --this-node" in " ".join(command["exec"]["command"])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda o: _pre_stop(o, ["/bin/sh", "-c", "ray stop"]), "preStop must drain"),
        (
            lambda o: _pre_stop(
                o, ["/bin/sh", "-c", "ray stop; specserve drain --this-node --timeout 30"]
            ),
            "preStop must drain",
        ),
        (lambda o: _worker(o).update(terminationGracePeriodSeconds=40), "< drain 30"),
        (lambda o: _worker(o).pop("terminationGracePeriodSeconds"), "30 < drain"),  # k8s default
        (lambda o: _shutdown_timeout(o, 45), "drain timeout 30 < shutdown_timeout_s 45"),
    ],
)
def test_drain_check_catches(rendered, change, message):
    found = kuberay.drain_problems(_mutated(rendered["prod"], "RayService", "specserve", change))
    assert any(message in p for p in found), found


# variables the manifests set only to build another one ($(VAR) in a URL): not read by specserve
COMPOSING_ONLY = {"SPECSERVE_REDIS_PASSWORD", "SPECSERVE_POOL_REDIS_PASSWORD"}


def _container_env(objs: list[dict], container: dict) -> set[str]:
    """The names a container's environment gets: its `env` and the ConfigMaps of `envFrom`."""
    names = {item["name"] for item in container.get("env", [])}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            names |= set(the(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    return names


def test_manifests_name_only_the_variables_specserve_reads(rendered):
    for name, objs in rendered.items():
        for group, container in ray_containers(_rayservice(objs)).items():
            env = _container_env(objs, container)
            ours = {n for n in env if n.startswith("SPECSERVE_") or n == EnvVar.REDIS_URL}
            unknown = ours - set(EnvVar) - COMPOSING_ONLY
            assert not unknown, f"{name}/{group}: variables specserve does not read: {unknown}"
            assert set(DEPLOYMENT_VARIABLES) <= env, f"{name}/{group}"
