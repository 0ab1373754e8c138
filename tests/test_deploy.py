"""The multi-host deployment files (issue 29): deploy/slurm.sbatch and deploy/k8s-jobset.yaml run one torchrun per
node whose c10d rendezvous joins every rank into one `cpbench worker --multi-host` gang, and say what each
environment variable does.

Scenarios: the sbatch is valid bash; its `srun torchrun` line starts `-m bench_server worker --multi-host` under the
c10d rendezvous on the allocation's first node, with one torchrun per node; every variable it sets or reads beyond
Slurm's own is introduced by a comment. The JobSet parses as YAML; its pods run the same torchrun line; its pod count
agrees in parallelism, completions and NNODES, its ranks per pod with the GPU limit, its rendezvous host is pod 0's
DNS name; every environment variable is introduced by a comment. README's "Multi-host" section names both files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "deploy" / "slurm.sbatch"
JOBSET = ROOT / "deploy" / "k8s-jobset.yaml"


def torchrun_line(text: str) -> str:
    """The torchrun command line (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [ln for ln in joined.splitlines() if "torchrun " in ln and not ln.lstrip().startswith("#")]
    assert len(lines) == 1, lines
    return lines[0]


def test_sbatch_runs_torchrun_with_c10d_and_the_multi_host_worker() -> None:
    text = SBATCH.read_text()
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    line = torchrun_line(text)
    assert line.lstrip().startswith("srun ") and "--ntasks-per-node=1" in line
    assert "--rdzv-backend c10d" in line and '--rdzv-endpoint "$RDZV_HOST:$RDZV_PORT"' in line
    assert '--nnodes "$SLURM_JOB_NUM_NODES"' in line and '--rdzv-id "$SLURM_JOB_ID"' in line
    assert line.rstrip().endswith("-m bench_server worker --multi-host")
    assert re.search(r"RDZV_HOST=\"\$\(scontrol show hostnames \"\$SLURM_JOB_NODELIST\" \| head -n 1\)\"", text)


def test_sbatch_says_what_each_variable_does() -> None:
    lines = SBATCH.read_text().splitlines()
    used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", "\n".join(ln for ln in lines if not ln.lstrip().startswith("#"))))
    ours = {v for v in used if not v.startswith("SLURM_")} - {"PWD"}  # Slurm's and the shell's own
    assert ours >= {"CPBENCH_DATABASE_URL", "CPBENCH_ARTIFACT_DIR", "GPUS_PER_NODE", "RDZV_PORT", "RDZV_HOST", "MAX_RESTARTS"}
    for var in ours:
        where = next(
            i
            for i, ln in enumerate(lines)
            if re.match(rf"\s*(export |: \"\$\{{)?{var}\b", ln) or f"{var}=" in ln.split("#")[0]
        )
        above = lines[where - 1].lstrip()
        assert above.startswith("#") and (var in above or "rendezvous" in above), (var, above)


@pytest.fixture(scope="module")
def jobset() -> dict:
    return yaml.safe_load(JOBSET.read_text())


def test_jobset_runs_torchrun_on_n_pods(jobset: dict) -> None:
    assert jobset["apiVersion"].startswith("jobset.x-k8s.io/") and jobset["kind"] == "JobSet"
    (rjob,) = jobset["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    (container,) = job["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert job["completionMode"] == "Indexed"
    assert job["parallelism"] == job["completions"] == int(env["NNODES"]["value"])
    assert int(env["GPUS_PER_POD"]["value"]) == container["resources"]["limits"]["nvidia.com/gpu"]
    name = jobset["metadata"]["name"]
    assert env["RDZV_HOST"]["value"] == f"{name}-{rjob['name']}-0-0.{name}"
    line = " ".join(container["args"])
    assert "torchrun " in line and "--rdzv-backend c10d" in line and '--rdzv-endpoint "$RDZV_HOST:$RDZV_PORT"' in line
    assert '--nnodes "$NNODES"' in line and line.rstrip().endswith("-m bench_server worker --multi-host")
    assert env["CPBENCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert {env[k]["value"] for k in ("NCCL_NVLS_ENABLE",)} == {"0"}


def test_jobset_says_what_each_variable_does() -> None:
    lines = JOBSET.read_text().splitlines()
    names = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := re.match(r"\s*- name: ([A-Z][A-Z0-9_]+)\s*$", ln))]
    assert len(names) >= 10
    for i, var in names:
        j = i - 1
        while not lines[j].lstrip().startswith("#"):  # a group of related variables shares its comment
            assert re.match(r"\s*(- name: [A-Z_]+|value: .*|valueFrom:|\w+: \{.*\})\s*$", lines[j]), (var, lines[j])
            j -= 1
        assert lines[j].lstrip().startswith("#"), var


def test_readme_points_at_the_deploy_files() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Multi-host", 1)[1].split("\n## ", 1)[0]
    assert "deploy/slurm.sbatch" in section and "deploy/k8s-jobset.yaml" in section and "cpbench bench comm" in section
