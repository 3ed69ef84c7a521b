"""The cold-process benchmark runs ``swafuzz fuzz --json`` as a user would and reads back
what the report says, beside the process's own wall time."""

from swafuzz.tools.bench import bench_cold


def test_cold_benchmark_reports_first_sight_within_elapsed_within_process_wall_time():
    lines: list[str] = []
    bench_cold(seeds=1, subjects=("pool-start-layer",), out=lines.append)
    (row,) = [line for line in lines if line.startswith("pool-start-layer")]
    found, first, first_max, elapsed, elapsed_max, wall, wall_max = row.split()[1:]
    assert found == "1/1"
    assert 0 < float(first) <= float(elapsed) < float(wall)  # imports come before the clock starts
