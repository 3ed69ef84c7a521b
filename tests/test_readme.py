"""The README's promises hold: its adapter example runs and diverges as described, and its
command table matches the CLI."""

from __future__ import annotations

import re
from pathlib import Path

from harness.fuzz import fuzz
from harness.registry import SubjectInfo, subject_names

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_adapter_example_is_found_to_diverge():
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    info = SubjectInfo("readme-example", namespace["MetadataCachedTranslation"], expected="diverges")
    result = fuzz(info, settings="ci", max_examples=1000)
    assert result.divergence is not None
    assert result.divergence.source["kind"] in ("graph_capture", "earlier_step", "earlier_forward")


def test_readme_lists_every_builtin_subject():
    for name in subject_names():
        assert f"`{name}`" in README, name
