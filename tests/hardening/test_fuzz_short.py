"""Short, seeded runs of the atheris fuzz targets in fuzz/: any crash fails the test.

Each target runs in its own process under libFuzzer for a fixed number of inputs
with a fixed seed (so a run is reproducible), on a scratch copy of its seed corpus,
with the shared dictionary. Longer runs: see fuzz/README.md.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "atheris", reason="atheris (a dev dependency) has no wheel for this Python or platform"
)

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
RUNS = 4000


@pytest.mark.parametrize(("target", "corpus"), [("fuzz_classify", None), ("fuzz_sse", "sse")])
def test_fuzz_target_survives_a_short_run(tmp_path: Path, target: str, corpus: str | None) -> None:
    """``RUNS`` inputs (seed 1, inputs ≤ 4 KiB, 10 s per input at most) without a crash,
    a timeout or running out of memory."""
    work = tmp_path / "corpus"
    if corpus is not None:
        shutil.copytree(FUZZ / "corpus" / corpus, work)
    else:
        work.mkdir()
    command = [
        sys.executable, str(FUZZ / f"{target}.py"), str(work), f"-runs={RUNS}", "-seed=1",
        "-max_len=4096", "-timeout=10", "-rss_limit_mb=2048", f"-dict={FUZZ / 'json.dict'}",
        f"-artifact_prefix={tmp_path}/",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False
    )
    output = done.stdout + done.stderr
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name != "corpus")
    assert done.returncode == 0, output[-4000:]
    assert f"Done {RUNS} runs" in output, output[-4000:]
    assert not crashes, crashes
