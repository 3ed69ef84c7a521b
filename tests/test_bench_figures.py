"""Measured figures reach the page that shows them from the benchmark, not by hand.

``swafuzz bench --suite mutants --write-figures docs/benchmarks.md`` writes its table in
place of the one it wrote before; the committed table must add up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swafuzz.tools.bench import FIGURES_END, FIGURES_START, main, mutants_table, write_figures

PAGE = Path(__file__).parent.parent / "docs" / "benchmarks.md"
COMMAND = "swafuzz bench --suite mutants --budget 6"


def _report(made, killed, equivalent, never_read, not_runnable, survived, times, adversarial=0):
    return {"made": made, "killed": killed, "equivalent": equivalent, "never_read": never_read,
            "not_runnable": not_runnable, "survived": survived,
            "killed_by_profile": {"realistic": killed - adversarial, "adversarial": adversarial},
            "time_to_kill": dict(zip(("median_s", "p90_s", "max_s"), times))}


FIGURES = {
    "subjects": {"uncached": _report(1, 1, 0, 0, 0, 0, (0.01, 0.01, 0.01)),
                 "step-keyed-capture": _report(13, 10, 3, 0, 0, 0, (0.01, 0.44, 3.03), adversarial=1)},
    "overall": {**_report(14, 11, 3, 0, 0, 0, (0.01, 0.44, 3.03)), "counted": 11, "kill_rate": 1.0},
}


def test_the_mutants_table_has_a_row_per_subject_and_one_over_all():
    assert mutants_table(FIGURES) == [
        "| subject | made | killed | equivalent | never read | not runnable | survived "
        "| time to kill median / p90 / max |",
        "|---|---|---|---|---|---|---|---|",
        "| `uncached` | 1 | 1 | 0 | 0 | 0 | 0 | 0.01 / 0.01 / 0.01 s |",
        "| `step-keyed-capture` | 13 | 10 (1 adversarial) | 3 | 0 | 0 | 0 | 0.01 / 0.44 / 3.03 s |",
        "| all | 14 | 11 of 11 (100.0%) | 3 | 0 | 0 | 0 | 0.01 / 0.44 / 3.03 s |",
    ]


def test_the_figures_replace_only_what_the_same_command_wrote(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{FIGURES_START}{COMMAND} -->\nold table\n{FIGURES_END}\noutro\n")
    write_figures(page, COMMAND, ["new", "table"])
    assert page.read_text() == f"intro\n{FIGURES_START}{COMMAND} -->\nnew\ntable\n{FIGURES_END}\noutro\n"


def test_a_page_without_a_place_for_the_figures_is_left_alone_with_a_message(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("a page written by hand\n")
    with pytest.raises(SystemExit, match="has no place for these figures"):
        write_figures(page, COMMAND, ["table"])
    assert page.read_text() == "a page written by hand\n"


def test_figures_are_written_only_for_the_suite_that_makes_them(capsys):
    with pytest.raises(SystemExit):
        main(["--suite", "peer", "--write-figures", str(PAGE)])
    assert "--write-figures writes the mutants suite's table" in capsys.readouterr().err


def _numbers(cell: str) -> list[float]:
    return [float(word) for word in cell.replace("(", " ").replace(")", " ").replace("%", " ").split()
            if word.replace(".", "", 1).isdigit()]


def test_the_committed_mutants_table_adds_up():
    text = PAGE.read_text(encoding="utf-8")
    block = text.split(f"{FIGURES_START}{COMMAND} -->\n", 1)[1].split(FIGURES_END, 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]
    *subjects, overall = rows
    assert overall[0] == "all" and subjects
    for column in (1, 3, 4, 5, 6):  # made, equivalent, never read, not runnable, survived
        assert sum(int(row[column]) for row in subjects) == int(overall[column]), rows[0][column]
    killed, counted, _ = _numbers(overall[2])
    assert killed == sum(_numbers(row[2])[0] for row in subjects)
    assert counted == int(overall[1]) - int(overall[3]) - int(overall[4]) - int(overall[5])
    assert _numbers(overall[7])[2] == max(_numbers(row[7])[2] for row in subjects)  # the slowest kill
