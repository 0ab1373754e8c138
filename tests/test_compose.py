"""Packaging promises: docker-compose.yml, the Dockerfile and the nightly workflow say what README.md says.

Scenarios: the compose file parses and names the services db / migrate / api / worker; PostgreSQL 15 with a
pg_isready healthcheck on a named volume and port 5432; the one-shot migration runs `cpbench db upgrade` after the
database is healthy; the API serves on port 8000 after the migration completed; the worker reserves every NVIDIA
GPU and keeps NVLink multicast off; secrets come from .env. The Dockerfile is CPU by default with a CUDA base as a
build argument. The workflow runs the regression on a self-hosted GPU runner and uploads the reports.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def load_compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_services_ports_volumes() -> None:
    c = load_compose()
    s = c["services"]
    assert set(s) == {"db", "migrate", "api", "worker"}
    assert s["db"]["image"] == "postgres:15"
    assert "5432:5432" in s["db"]["ports"] and "8000:8000" in s["api"]["ports"]
    assert "pgdata" in c["volumes"] and "pgdata:/var/lib/postgresql/data" in s["db"]["volumes"]
    assert "artifacts" in c["volumes"]
    for name in ("api", "worker"):
        assert "artifacts:/data/artifacts" in s[name]["volumes"]


def test_compose_db_healthcheck_and_start_order() -> None:
    s = load_compose()["services"]
    test = s["db"]["healthcheck"]["test"]
    assert "pg_isready" in (test if isinstance(test, str) else " ".join(test))
    assert s["migrate"]["command"] == ["cpbench", "db", "upgrade"]
    assert s["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert s["migrate"]["restart"] == "no"
    assert s["api"]["command"] == ["cpbench", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert s["worker"]["command"] == ["cpbench", "worker"]
    for name in ("api", "worker"):
        deps = s[name]["depends_on"]
        assert deps["db"]["condition"] == "service_healthy"
        assert deps["migrate"]["condition"] == "service_completed_successfully"
    assert "/healthz" in " ".join(s["api"]["healthcheck"]["test"])


def test_compose_worker_gpu_and_environment() -> None:
    s = load_compose()["services"]
    devices = s["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    env = s["worker"]["environment"]
    assert {k: str(env[k]) for k in MULTICAST_OFF} == MULTICAST_OFF
    assert s["worker"]["build"]["args"]["BASE_IMAGE"].startswith("nvidia/cuda:")
    for name in ("migrate", "api", "worker"):
        env = s[name]["environment"]
        assert re.fullmatch(r"postgresql\+psycopg://cpbench:\$\{POSTGRES_PASSWORD[^}]*\}@db:5432/cpbench", env["CPBENCH_DATABASE_URL"])
        assert env["CPBENCH_API_TOKEN"].startswith("${CPBENCH_API_TOKEN")
    example = (ROOT / ".env.example").read_text()
    assert "CPBENCH_API_TOKEN=" in example and "POSTGRES_PASSWORD=" in example


def test_readme_promises_match_compose() -> None:
    readme = (ROOT / "README.md").read_text()
    for word in ("docker-compose.yml", "port 8000", "`pgdata`", "`migrate`", "`api`", "`worker`", ".env.example"):
        assert word in readme, word


def test_dockerfile_cpu_default_cuda_by_build_arg() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert "whl/cpu" in text and 'pip install ".[${EXTRAS}]"' in text
    for k, v in MULTICAST_OFF.items():
        assert f"{k}={v}" in text


def test_nightly_workflow() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    on = wf[True]  # YAML 1.1 reads the key `on` as a boolean
    assert "schedule" in on and "workflow_dispatch" in on
    job = wf["jobs"]["regress"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert {k: str(wf["env"][k]) for k in MULTICAST_OFF} == MULTICAST_OFF
    script = "\n".join(step.get("run", "") for step in job["steps"])
    assert 'pip install -e ".[gpu,postgres]"' in script and "cpbench db upgrade" in script
    assert "cpbench regress nightly --baseline nightly-baseline" in script
    assert "./dev test" not in script
    uploads = [st for st in job["steps"] if str(st.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and "reports/" in uploads[0]["with"]["path"]
