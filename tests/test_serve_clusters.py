"""clusters/*.yaml against Ray's own schemas: the cluster launcher's (ray-schema.json after `ray up`'s default
filling), Serve's config schema, and KubeRay's RayCluster -> autoscaler translation; plus our AppConfig and the
pool arithmetic (a replica must fit a pool node, and the pool must hold max_replicas)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from specdiff.serving.config import AppConfig

CLUSTERS = Path(__file__).resolve().parent.parent / "clusters"


def load(name):
    return yaml.safe_load((CLUSTERS / name).read_text())


def serve_schema(config: dict):
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema.parse_obj(config)


def app_args(serve_config: dict) -> AppConfig:
    (application,) = serve_config["applications"]
    assert application["import_path"] == "specdiff.serving.app:build_app"
    return AppConfig.from_args(application["args"])


def check_pools(cfg: AppConfig, node_types: dict[str, dict]):
    """Every pool resource is declared by a node type on which a replica fits, with room for max_replicas."""
    for options, pool in ((cfg.drafter, cfg.drafter_pool), (cfg.verifier, cfg.verifier_pool)):
        hosts = {name: t for name, t in node_types.items() if t["resources"].get(pool)}
        assert hosts, f"no node type declares {pool}"
        capacity = 0
        for name, t in hosts.items():
            per_node = t["resources"][pool]
            assert per_node * options.num_gpus <= t["resources"].get("GPU", 0), f"{name}: {pool} units need more GPUs"
            assert per_node * options.num_cpus <= t["resources"].get("CPU", 0), f"{name}: {pool} units need more CPUs"
            capacity += per_node * t["max_workers"]
        assert options.max_replicas <= capacity, f"{pool}: max_replicas {options.max_replicas} > capacity {capacity}"


@pytest.mark.parametrize("name,provider", [("aws.yaml", "aws"), ("gcp.yaml", "gcp")])
def test_launcher_config_is_valid(name, provider):
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = load(name)
    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)  # ray-schema.json + head/worker consistency
    assert config["provider"]["type"] == provider
    types = config["available_node_types"]
    assert set(types) == {"head", "drafter_a100", "verifier_a100"}
    assert types["drafter_a100"]["resources"]["drafter_pool"] >= 1 and types["drafter_a100"]["resources"]["GPU"] == 8
    assert types["verifier_a100"]["resources"]["verifier_pool"] >= 1
    check_pools(app_args(load("serve-paper.yaml")), types)


def test_bad_launcher_config_is_rejected():
    # Guards the test above: the schema really is enforced.
    from ray.autoscaler._private.util import prepare_config, validate_config

    import jsonschema

    raw = load("aws.yaml")
    raw["max_wrokers"] = 1
    with pytest.raises(jsonschema.ValidationError, match="max_wrokers"):
        validate_config(prepare_config(raw))
    raw = load("aws.yaml")
    raw["available_node_types"]["drafter_a100"]["resources"]["drafter_pool"] = "eight"
    with pytest.raises(jsonschema.ValidationError, match="eight"):
        validate_config(prepare_config(raw))


@pytest.mark.parametrize("name", ["serve-paper.yaml", "serve-local.yaml"])
def test_serve_config_is_valid(name):
    config = load(name)
    schema = serve_schema(config)
    assert schema.applications[0].import_path == "specdiff.serving.app:build_app"
    cfg = app_args(config)
    assert cfg.pools
    if name == "serve-paper.yaml":
        assert cfg.verifier.num_gpus == 2 and cfg.drafter.num_gpus == 1
        assert cfg.models.verifier.endswith("72B-Instruct")


def test_bad_serve_config_is_rejected():
    config = load("serve-paper.yaml")
    config["applications"][0]["import_path"] = "no_attribute_given"
    with pytest.raises(Exception, match="import_path"):
        serve_schema(config)
    config = load("serve-paper.yaml")
    config["applications"][0]["args"]["drafter"]["max_replicas"] = 0
    with pytest.raises(ValueError, match="max_replicas"):
        app_args(config)


def test_kuberay_rayservice_is_valid():
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    manifest = load("kuberay-rayservice.yaml")
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    spec = manifest["spec"]
    serve_config = yaml.safe_load(spec["serveConfigV2"])
    serve_schema(serve_config)
    cfg = app_args(serve_config)
    # KubeRay's own translation of the RayCluster spec into an autoscaler config (validated against ray-schema.json).
    ray_cr = {"metadata": {"name": "specdiff", "namespace": "default"}, "spec": spec["rayClusterConfig"]}
    autoscaling = _derive_autoscaling_config_from_ray_cr(ray_cr)
    types = autoscaling["available_node_types"]
    assert types["drafter-a100"]["resources"]["drafter_pool"] == 8
    assert types["verifier-a100"]["resources"]["verifier_pool"] == 4
    assert types["verifier-a100"]["resources"]["GPU"] == 8
    check_pools(cfg, types)
    # The embedded Serve config is the paper one.
    assert serve_config["applications"][0]["args"]["models"] == load("serve-paper.yaml")["applications"][0]["args"]["models"]
