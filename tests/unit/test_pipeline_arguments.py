"""The pipeline checks its arguments and inputs before any Spark application starts, one line each."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.checks import parquet_number_types
from spark_jobs.pipeline import build_parser, check_arguments, declared_sums


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


def test_declared_sums_are_checked_and_the_streaming_chain_takes_none(tmp_path: Path) -> None:
    assert problems(tmp_path, "--sum", "amount:double") == []
    assert problems(tmp_path, "--sum", "amount:decimal") == [
        "--sum amount:decimal: a summed column is declared long or double (what SUM gives for integral and "
        "fractional input), not decimal"]
    args = build_parser().parse_args(["windowed-count", "--streaming", "--source-topic", "s", "--key", "user",
                                      "--event-time", "t", "--window", "1h", "--sum", "amount:long",
                                      "--output", str(tmp_path / "out.csv")])
    assert check_arguments(args) == [
        "--sum COL:TYPE: a declared type is for the bounded pipeline (--input); the streaming chain sums each "
        "value as the number it is"]


def test_a_parquet_inputs_number_columns_are_declared_from_its_footers(tmp_path: Path) -> None:
    """Integer columns sum to long, floating-point ones to double; a decimal or string column, a column
    missing, or one typed differently in two part files is left to the data (not declared)."""
    table = pa.table({"i8": pa.array([1], pa.int8()), "i64": [2], "f32": pa.array([1.5], pa.float32()),
                      "f64": [2.5], "dec": pa.array([Decimal("1.5")], pa.decimal128(5, 2)), "s": ["x"],
                      "mixed": [1]})
    single = tmp_path / "one.parquet"
    pq.write_table(table, single)
    columns = ["i8", "i64", "f32", "f64", "dec", "s", "mixed", "nope"]
    assert parquet_number_types(str(single), columns) == {
        "i8": "long", "i64": "long", "f32": "double", "f64": "double", "mixed": "long"}
    parts = tmp_path / "many.parquet"
    parts.mkdir()
    pq.write_table(table, parts / "part-00000-a.snappy.parquet")
    pq.write_table(table.set_column(6, "mixed", pa.array([0.5])), parts / "part-00001-a.snappy.parquet")
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-00000-a.snappy.parquet.crc").write_bytes(b"\0")
    assert parquet_number_types(str(parts), columns) == {"i8": "long", "i64": "long", "f32": "double",
                                                         "f64": "double"}
    assert parquet_number_types(str(tmp_path / "in.csv"), columns) == {}


def test_the_jobs_get_the_command_lines_types_first_then_the_footers(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["u"], "t": [1], "a": [1], "b": [2], "c": ["x"]}), source)
    args = build_parser().parse_args(["windowed-count", "--input", str(source), "--key", "user", "--event-time", "t",
                                      "--window", "1h", "--output", str(tmp_path / "out.csv"),
                                      "--sum", "a:double", "--sum", "b", "--sum", "c"])
    assert declared_sums(args) == {"a": "double", "b": "long", "c": None}


def test_an_option_of_the_other_chain_is_refused_not_ignored(tmp_path: Path) -> None:
    """The bounded pipeline used to accept --stall-limit, --idle-timeout, --max-rate... and do nothing with
    them; each now gets one line, as does a bounded-only option given with --streaming. Their defaults
    (not given) pass."""
    assert problems(tmp_path, "--stall-limit", "60s", "--max-rate", "10", "--until-source-end") == [
        f"{option} is for the streaming chain (--streaming); the bounded pipeline (--input) would ignore it"
        for option in ("--until-source-end", "--stall-limit", "--max-rate")]
    assert problems(tmp_path, "--null-value", "NA", "--commit-rows", "10") == []
    args = build_parser().parse_args(["windowed-count", "--streaming", "--source-topic", "s", "--key", "user",
                                      "--event-time", "t", "--window", "1h", "--output", str(tmp_path / "out.csv"),
                                      "--commit-rows", "5", "--stall-limit", "60s", "--until-source-end"])
    assert (args.stall_limit, args.until_source_end, args.commit_rows) == ("60s", True, 5)
    assert check_arguments(args) == [
        "--commit-rows is for the bounded pipeline (--input); the streaming chain (--streaming) would ignore it"]
    defaults = build_parser().parse_args(["windowed-count", "--streaming", "--source-topic", "s", "--key", "u",
                                          "--event-time", "t", "--window", "1h", "--output", "o.csv"])
    assert (defaults.stall_limit, defaults.idle_timeout, defaults.until_source_end) == ("180s", "10s", False)
