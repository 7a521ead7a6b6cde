"""The pipeline checks its arguments and inputs before any Spark application starts, one line each."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.pipeline import build_parser, check_arguments


def problems(tmp_path: Path, *extra: str, input_text: str | None = "user,event_time,amount\nu1,1,2\n") -> list[str]:
    source = tmp_path / "in.csv"
    if input_text is not None:
        source.write_text(input_text)
    args = build_parser().parse_args(["windowed-count", "--input", str(source), "--key", "user", "--event-time",
                                      "event_time", "--window", "1h", "--output", str(tmp_path / "out.csv"), *extra])
    return check_arguments(args)


def test_good_arguments_pass(tmp_path: Path) -> None:
    assert problems(tmp_path, "--sum", "amount") == []


def test_each_problem_is_one_line(tmp_path: Path) -> None:
    found = problems(tmp_path, "--window", "0m", "--allowed-lateness", "abc", "--sum", "amout")
    assert found == [
        "--window: a duration must be above zero, got '0m'",
        "--allowed-lateness: not a duration: 'abc' (use e.g. 500ms, 30s, 15m, 1h, 1d)",
        f"--sum amout: no such column in {tmp_path / 'in.csv'} (columns: user, event_time, amount)",
    ]
    assert problems(tmp_path, input_text="") == [f"--input {tmp_path / 'in.csv'}: the file is empty"]
    (tmp_path / "in.csv").unlink()
    assert problems(tmp_path, input_text=None) == [f"--input {tmp_path / 'in.csv'}: no such file or directory"]
    (tmp_path / "out.csv").mkdir()
    assert problems(tmp_path) == [f"--output {tmp_path / 'out.csv'}: is a directory; name the output file"]
