"""pytest plugin: gate a subject from an engine's own test suite.

Installed with swafuzz (entry point ``pytest11``) and inert until asked for, in one of two ways:

- on the command line, ``pytest --swafuzz-subject NAME [--swafuzz-subject NAME2]
  [--swafuzz-profile adversarial]`` adds one test per subject and profile;
- in a test file, ``test_my_cache = fuzz_test("my_module:MyCache", profile="adversarial")``.

Either way the test is an ordinary Hypothesis ``@given`` test (:func:`swafuzz.search.fuzz.scenario_test`):
pytest-xdist distributes it, ``--hypothesis-profile`` (``swafuzz-ci``, ``swafuzz-dev``, ...),
``--hypothesis-seed`` and ``--hypothesis-show-statistics`` apply to it, and HypoFuzz or any
other runner of Hypothesis tests can fuzz it unchanged. A failure says the diagnosis sentence
and the command that replays it, whose replay file is written where, and as, the CLI writes its own
(:class:`swafuzz.search.campaign.DivergenceLog`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from .names import PROFILE_PREFIX

if TYPE_CHECKING:
    import hypothesis

    from .reference import Scenario

    from .run.executor import RunResult

# pytest loads this module in every session wherever swafuzz is installed: the fuzzing
# machinery (torch and all) is imported only once swafuzz is asked for
DEFAULT_REPORT_DIR = Path("reports")
# replay files of pytest runs are named <subject>-<profile>-pytest.json
RUN_NAME = "pytest"

_report_dir = DEFAULT_REPORT_DIR  # --swafuzz-report-dir, for the tests of this session


def fuzz_test(subject: str, profile: str = "realistic", *, settings: hypothesis.settings | None = None,
              device: str = "cpu", report_dir: str | os.PathLike | None = None) -> Callable[[], None]:
    """A ready Hypothesis test of ``subject`` (a built-in name, ``module:attr`` or
    ``sglang:<target>``) on scenarios of ``profile``; assign it to a ``test_*`` name.

    How long it searches is the business of the active Hypothesis profile (``swafuzz-ci``,
    ``swafuzz-dev``, ...), or of ``settings`` where given (the test carries its settings
    already, so they are passed here rather than stacked with ``@settings``). Only the
    deadline and the health checks about slow examples are off, since an example takes the
    subject's time. Each divergence is written to ``REPORT_DIR/replays/`` (default: this
    session's ``--swafuzz-report-dir``, else ``reports``) and the failure notes
    ``swafuzz replay PATH``.
    """
    import hypothesis
    from hypothesis import HealthCheck

    from .search.campaign import DivergenceLog, campaign_torch_threads
    from .search.fuzz import loaded_settings_profile, scenario_test
    from .subjects.registry import resolve_subject

    info = resolve_subject(subject)
    logs: list[DivergenceLog] = []  # one for the test: every failure of its search goes to one file

    def record(scenario: Scenario, features: list[str], outcome: RunResult) -> None:
        if outcome.passed:
            return
        if not logs:
            logs.append(DivergenceLog(subject, profile, loaded_settings_profile(), device,
                                      Path(report_dir or _report_dir) / "replays", RUN_NAME))
        path = _shown(logs[0].write(scenario, outcome.divergence))
        hypothesis.note(f"replay file: {path}\nreproduce:   swafuzz replay {path}")

    search = hypothesis.settings(
        settings, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )(scenario_test(info, profile, device=device, on_example=record))

    @functools.wraps(search)  # keeps .hypothesis, which HypoFuzz and the pytest plugin read
    def test() -> None:
        # under pytest -n, as under --workers, a process per core each running torch on a
        # thread per core stalls small tensor operations (see campaign_torch_threads)
        with campaign_torch_threads():
            search()

    test.swafuzz_subject = subject
    return test


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory where it lies below it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("swafuzz", "swafuzz: differential fuzzing of cached SWA write locations")
    group.addoption("--swafuzz-subject", action="append", default=[], metavar="NAME",
                    help="add a fuzz test of this subject (a built-in name, module:attr or "
                         "sglang:<target>); repeat for several")
    group.addoption("--swafuzz-profile", action="append", metavar="PROFILE",
                    help="scenario profile of the added tests (realistic or adversarial; repeat for "
                         "both; default: realistic)")
    group.addoption("--swafuzz-device", default="cpu", metavar="cpu|cuda",
                    help="where the subjects' tensors live (default: cpu)")
    group.addoption("--swafuzz-report-dir", type=Path, metavar="DIR",
                    help="replay files of failures go to DIR/replays (default: reports, under the rootdir)")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's plugin loads --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    global _report_dir
    _report_dir = config.getoption("swafuzz_report_dir") or config.rootpath / DEFAULT_REPORT_DIR
    hypothesis_profile = config.getoption("hypothesis_profile", None) or ""
    if hypothesis_profile.startswith(PROFILE_PREFIX):
        import swafuzz.search.fuzz  # noqa: F401 - registers the swafuzz-* profiles
    subjects = config.getoption("swafuzz_subject")
    if not subjects:
        return
    from .strategies.scenarios import PROFILES

    from .subjects.registry import resolve_subject

    for profile in config.getoption("swafuzz_profile") or ():
        if profile not in PROFILES:
            raise pytest.UsageError(f"--swafuzz-profile {profile}: choose {' or '.join(PROFILES)}")
    for subject in subjects:
        try:
            resolve_subject(subject)
        except Exception as exc:  # noqa: BLE001 - any failure to load it is the user's to fix
            raise pytest.UsageError(f"--swafuzz-subject {subject}: {exc}") from None
class SubjectTests(pytest.Collector):
    """The tests that ``--swafuzz-subject`` asks for, one per subject and profile."""

    def collect(self) -> list[pytest.Item]:
        options = self.config.option
        profiles = options.swafuzz_profile or ["realistic"]
        return [
            pytest.Function.from_parent(
                self, name=f"{subject}[{profile}]",
                callobj=fuzz_test(subject, profile, device=options.swafuzz_device),
            )
            for subject in dict.fromkeys(options.swafuzz_subject)
            for profile in dict.fromkeys(profiles)
        ]


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's own hook reads the failing examples
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    # Hypothesis offers a patch that adds each failing example to the test's source as an
    # @example; a swafuzz test's source is swafuzz's own, and its replay file is the way back
    if getattr(getattr(item, "obj", None), "swafuzz_subject", None) is not None:
        item.__dict__.pop("_hypothesis_failing_examples", None)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
    if config.getoption("swafuzz_subject"):
        items.extend(SubjectTests.from_parent(session, name="swafuzz", nodeid="swafuzz").collect())
