"""The Dockerfile: what can be checked without a Docker engine (there is none on the test
machine). Its stages and commands, that it agrees with pyproject.toml and the Kubernetes
Deployment, and that the files its build stage copies build a complete wheel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_matches_the_package_and_the_manifests() -> None:
    """Two python:3.11-slim stages; the build stage makes the wheel with ``pip wheel .``
    compiling the core; the ENTRYPOINT is the project's console script; the exposed port, the
    user and the CMD's config path are those of the gateway Deployment."""
    instructions = _dockerfile()
    froms = [args for op, args in instructions if op == "FROM"]
    assert froms == ["python:3.11-slim AS build", "python:3.11-slim AS runtime"]
    runs = " ".join(args for op, args in instructions if op == "RUN")
    assert "SLUICEGATE_COMPILE=1 python -m pip wheel" in runs
    assert re.search(r"pip wheel .*--wheel-dir /wheels \.(\s|$)", runs)
    (entrypoint,) = [args for op, args in instructions if op == "ENTRYPOINT"]
    assert yaml.safe_load(entrypoint) == list(PROJECT["scripts"])
    deployment = yaml.safe_load((REPO / "deploy" / "k8s" / "base" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (expose,) = [args for op, args in instructions if op == "EXPOSE"]
    assert int(expose) == container["ports"][0]["containerPort"]
    (user,) = [args for op, args in instructions if op == "USER"]
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert user == f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"
    (cmd,) = [args for op, args in instructions if op == "CMD"]
    assert ["sluicegate", *yaml.safe_load(cmd)] == container["command"]


def test_docker_build_context_builds_a_complete_wheel(tmp_path: Path) -> None:
    """What the build stage COPYs exists, is not excluded by .dockerignore, and is enough for
    pip to build the wheel (plain Python here: no Docker on this machine), which holds every
    file of the package and the console script."""
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    context = tmp_path / "context"
    context.mkdir()
    for op, args in _dockerfile():
        if op != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = args.split()
        for source in sources:
            assert source not in ignored, f"COPY {source}, but .dockerignore excludes it"
            path = REPO / source
            assert path.exists(), f"COPY {source}: no such file"
            if path.is_dir():
                shutil.copytree(
                    path, context / source, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy(path, context / source)
    pip_wheel = ["pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    built = subprocess.run(
        [sys.executable, "-m", *pip_wheel, "-w", str(tmp_path / "wheels"), "."],
        cwd=context,
        env={"SLUICEGATE_COMPILE": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheels").glob("sluicegate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "src"
    expected = {
        str(path.relative_to(package))
        for path in (package / "sluicegate").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".so", ".c"}
    }
    assert expected - names == set(), "package files missing from the wheel (package-data?)"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert f"sluicegate = {PROJECT['scripts']['sluicegate']}" in scripts
