"""The job CLIs (ingest, window_aggregate, sink) check their arguments before any Spark application starts:
a bad one exits 2 with one ``error:`` line per problem and no trace. No Spark, no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.batch import ingest, sink, window_aggregate
from spark_jobs.checks import typed_sums
from spark_jobs.common import failure_lines

KAFKA = ["--bootstrap-servers", "127.0.0.1:1", "--run-id", "r1"]


def errors(capsys: pytest.CaptureFixture[str], main: object, *argv: str) -> list[str]:
    assert callable(main)
    assert main([*argv, *KAFKA]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err.splitlines()


def test_ingest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.csv"
    source.write_text("user,event_time,amount\nu1,1,2\n")
    base = ["--key", "user", "--event-time", "event_time", "--topic", "t"]
    assert errors(capsys, ingest.main, "--input", str(tmp_path / "nope.csv"), *base) == [
        f"python -m spark_jobs.batch.ingest: error: --input {tmp_path / 'nope.csv'}: no such file or directory"]
    assert errors(capsys, ingest.main, "--input", str(source), *base, "--carry", "amout", "--tasks", "0",
                  "--timeout", "0", "--rejects", str(tmp_path)) == [
        "python -m spark_jobs.batch.ingest: error: --timeout 0: must be above 0",
        f"python -m spark_jobs.batch.ingest: error: --carry amout: no such column in {source} (columns: user, "
        "event_time, amount)",
        "python -m spark_jobs.batch.ingest: error: --tasks 0: must be above 0",
        f"python -m spark_jobs.batch.ingest: error: --rejects {tmp_path}: unknown file type; use .csv, .json, .jsonl, "
        ".ndjson, .parquet",
        f"python -m spark_jobs.batch.ingest: error: --rejects {tmp_path}: is a directory; name the output file",
    ]
    source.write_text("")
    assert errors(capsys, ingest.main, "--input", str(source), *base) == [
        f"python -m spark_jobs.batch.ingest: error: --input {source}: the file is empty"]


def test_window_aggregate(capsys: pytest.CaptureFixture[str]) -> None:
    assert errors(capsys, window_aggregate.main, "--input-topic", "a", "--output-topic", "b", "--window", "0m",
                  "--partitions", "-1", "--spark-conf", "spark.x") == [
        "python -m spark_jobs.batch.window_aggregate: error: --spark-conf spark.x: expected KEY=VALUE",
        "python -m spark_jobs.batch.window_aggregate: error: --window: a duration must be above zero, got '0m'",
        "python -m spark_jobs.batch.window_aggregate: error: --partitions -1: must be above 0",
    ]


def test_a_summed_column_is_declared_long_or_double(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--sum COL:TYPE`` (and ingest's ``--carry COL:TYPE``): only long and double are types; another
    type's name is refused, naming what to use; any other colon is part of the column's name."""
    assert typed_sums(["a", "b:double", "c:long", "d:e", "f:g:long"]) == {
        "a": None, "b": "double", "c": "long", "d:e": None, "f:g": "long"}
    wrong = ("a summed column is declared long or double (what SUM gives for integral and fractional input), "
             "not float")
    assert errors(capsys, window_aggregate.main, "--input-topic", "a", "--output-topic", "b", "--window", "1h",
                  "--sum", "x:float") == [f"python -m spark_jobs.batch.window_aggregate: error: --sum x:float: {wrong}"]
    assert errors(capsys, sink.main, "--input-topic", "a", "--output", str(tmp_path / "out.csv"),
                  "--sum", "x:long", "--sum", "x:double") == [
        "python -m spark_jobs.batch.sink: error: --sum x:double: column 'x' is given twice"]
    source = tmp_path / "in.csv"
    source.write_text("user,event_time,amount\nu1,1,2\n")
    assert errors(capsys, ingest.main, "--input", str(source), "--key", "user", "--event-time", "event_time",
                  "--topic", "t", "--carry", "amount:int") == [
        f"python -m spark_jobs.batch.ingest: error: --carry amount:int: {wrong.replace('float', 'int')}"]
    assert ingest.check_arguments(ingest.build_parser().parse_args(
        ["--input", str(source), "--key", "user", "--event-time", "event_time", "--topic", "t",
         "--carry", "amount:double", *KAFKA])) == []


def test_sink_and_kafka_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert errors(capsys, sink.main, "--input-topic", "a", "--output", str(tmp_path / "out.txt")) == [
        f"python -m spark_jobs.batch.sink: error: --output {tmp_path / 'out.txt'}: unknown file type; use .csv, .json, "
        ".jsonl, .ndjson, .parquet"]
    (line,) = errors(capsys, sink.main, "--input-topic", "a", "--output", str(tmp_path / "out.csv"),
                     "-X", "no.such.setting=1")
    assert line.startswith("python -m spark_jobs.batch.sink: error: Kafka client setting 'no.such.setting'")


def test_exit_codes_are_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        sink.main(["--help"])
    assert exited.value.code == 0
    assert "exit status: 0 done; 1 the job failed" in " ".join(capsys.readouterr().out.split())


def test_a_failure_inside_spark_comes_down_to_its_cause() -> None:
    """A task's error reaches the driver inside a JVM error whose text holds the worker's Python trace."""
    spark_text = (
        "An error occurred while calling o71.count.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed\n"
        "  File \"/x/pyspark/sql/worker/plan_data_source_read.py\", line 1, in records\n"
        "    raise ValueError(\"inner\")\n"
        "ValueError: inner\n"
        "controlmsg.errors.ReadError: topic 't' partition 0 offset 7: the value is not JSON; to read past such\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n"
    )
    cause, todo = failure_lines(RuntimeError(spark_text))
    assert cause == "ReadError: topic 't' partition 0 offset 7: the value is not JSON; to read past such"
    assert "set aside the record" in todo
    assert failure_lines(KeyError("x")) == ("KeyError: 'x'", "see the full trace")


@pytest.mark.parametrize("module", ["pipeline", "generate", "batch.ingest", "batch.window_aggregate", "batch.sink",
                                    "runtime.ingest", "runtime.window", "runtime.sink", "stages.ingest",
                                    "stages.window", "stages.sink"])
def test_the_help_describes_the_job_in_whole_sentences(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` shows the docstring's first paragraph whole (its first line alone stopped mid-sentence)."""
    import importlib

    from spark_jobs import description

    job = importlib.import_module(f"spark_jobs.{module}")
    with pytest.raises(SystemExit) as exited:
        job.main(["--help"])
    assert exited.value.code == 0
    want = description(job.__doc__)
    assert want.endswith(".") and "\n" not in want, want
    assert want in " ".join(capsys.readouterr().out.split())


def _help_entry(help_text: str, flag: str) -> str:
    """The ``--help`` entry of ``flag`` (its line and the help's continuation lines), without whitespace, so
    that the column argparse wraps at does not count."""
    lines = help_text.split("options:", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("  -") or not lines[i].strip()),
               len(lines))
    return "".join("".join(lines[start:end]).split())


def test_the_window_jobs_and_the_pipeline_share_one_window_and_sum_option(capsys: pytest.CaptureFixture[str]) -> None:
    """``--window`` and ``--sum`` are defined once (:func:`spark_jobs.common.add_window_options`): the three
    window jobs and the pipeline show the same help for them."""
    from spark_jobs import pipeline
    from spark_jobs.common import SUM_HELP, WINDOW_HELP
    from spark_jobs.runtime import window as runtime_window
    from spark_jobs.stages import window as stages_window

    helps = {}
    for name, main, argv in (("batch", window_aggregate.main, ["--help"]),
                             ("stages", stages_window.main, ["--help"]),
                             ("runtime", runtime_window.main, ["--help"]),
                             ("pipeline", pipeline.main, ["windowed-count", "--help"])):
        with pytest.raises(SystemExit):
            main(argv)
        helps[name] = capsys.readouterr().out
    for flag, text in (("--window", WINDOW_HELP), ("--sum", SUM_HELP)):
        entries = {name: _help_entry(out, flag) for name, out in helps.items()}
        assert len(set(entries.values())) == 1, entries
        assert "".join(text.split()) in entries["pipeline"]
