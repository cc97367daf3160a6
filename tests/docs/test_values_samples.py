"""Every ```yaml block in README.md and docs/ that is Helm values for the chart (its
top-level keys include one of the chart's values.yaml keys) renders with ``helm template``:
the chart's schema and templates accept it, as a user would paste it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nsqworker"
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md")])
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
CHART_KEYS = set(yaml.safe_load((CHART / "values.yaml").read_text()))


def values_blocks() -> list[tuple[str, str]]:
    """``(page:line, block)`` for each yaml block that is chart values."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            try:
                doc = yaml.safe_load(match.group(1))
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict) and set(doc) & CHART_KEYS:  # one chart key: values
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def helm() -> str:
    found = shutil.which("helm", path=str(ROOT / ".tools" / "bin")) or shutil.which("helm")
    if found is None:
        pytest.fail("helm is missing: `make tools` builds it into .tools/bin")
    return found


def test_the_docs_have_values_samples() -> None:
    assert len(values_blocks()) >= 2  # docs/kubernetes.md and docs/spark.md at least


@pytest.mark.parametrize(("where", "block"), values_blocks(), ids=[w for w, _ in values_blocks()])
def test_a_values_sample_renders(where: str, block: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(block)
    # The required value a snippet may leave to the reader: the image.
    base = ["--set", "image.repository=registry.example/myservice"] if "image:" not in block else []
    done = subprocess.run(
        [helm(), "template", "sample", str(CHART), "-f", str(values), *base],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{where}: helm template refused it:\n{done.stderr}"
