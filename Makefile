# The two commands of the README, and the checks CI runs. VENV can point elsewhere (CI uses a fresh one).
VENV ?= .venv
PY := $(VENV)/bin/python
# What installs the project and its dependencies into $(VENV): pip, or CI's uv (.ci/run: the same packages
# from the same index, in about half the time).
INSTALL ?= $(PY) -m pip install -q

.PHONY: setup demo demo-streaming demo-protocol test test-spark42 lint bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(INSTALL) -e '.[dev]'
	cp tests/pyspark_from_package.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
	touch $@

setup: $(VENV)/.installed

demo: setup  ## the backfill pipeline (3 Spark apps, 2 Kafka topics) on the shipped sample; starts the local broker
	$(PY) -m spark_jobs.pipeline windowed-count --input examples/clicks.csv --key user --event-time event_time \
		--window 1h --sum amount --sum items --null-value NA --output out/clicks_hourly.csv

demo-streaming: setup  ## the streaming chain on 20,000 generated events, ended by the source's end; starts the local broker
	@set -e; topic=clicks-raw-$$(date +%s); \
	if [ -z "$$KAFKA_BOOTSTRAP_SERVERS" ]; then $(VENV)/bin/controlmsg broker start; fi; \
	$(PY) -m spark_jobs.generate --topic $$topic --events 20000 --rate 5000 --speedup 60 --late-fraction 0.01; \
	$(PY) -m spark_jobs.pipeline windowed-count --streaming --source-topic $$topic --until-source-end \
		--key user --event-time event_time --window 1m --sum amount --allowed-lateness 10s \
		--watermark-interval 1s --max-rate 2000 --output out/stream.csv

demo-protocol: setup  ## the protocol alone: 3 upstream tasks -> 4 partitions -> one consumer to end of stream
	$(VENV)/bin/controlmsg demo

test: setup  ## the whole test suite; starts its own broker unless KAFKA_BOOTSTRAP_SERVERS is set
	$(PY) -m tests.lanes --durations=25

# with_watermark relies on Spark internals (docs/SPARK.md): its tests also run on the oldest pyspark the project
# allows. A second venv holds pyspark 4.2.0 alone; every other package is the first venv's (a .pth adds its
# site-packages after the venv's own), so the install is one cached wheel, not a second dependency set.
SPARK42_VENV ?= $(VENV)-spark42
# The spark42-marked tests (spark-avro's and Delta's jars exist for Spark 4.2 only; pyproject deselects them
# elsewhere) run here alone: -m "" lifts that.
SPARK42_TESTS ?= tests/spark/test_two_streams_at_once.py tests/spark/test_event_time.py \
	tests/spark/test_plain_watermark.py tests/spark/test_avro_payloads.py tests/spark/test_delta_sink.py -m "" \
	-k "two_streams or slow_tasks_records or refused or adds_the_watermark or does_not_follow or avro or delta \
	or lagging_partition"

$(SPARK42_VENV)/.installed: $(VENV)/.installed
	rm -rf $(SPARK42_VENV)
	python3 -m venv $(SPARK42_VENV)
	$(SPARK42_VENV)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_path("purelib") + "/controlmsg-base.pth", "w").write("import site; site.addsitedir(%r)\n" % sys.argv[1])' \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
	$(SPARK42_VENV)/bin/python -m pip install -q --no-deps pyspark==4.2.0
	touch $@

test-spark42: $(SPARK42_VENV)/.installed  ## the event-time, Avro and Delta tests on pyspark 4.2.0
	$(SPARK42_VENV)/bin/python -c 'import pyspark, sys; sys.exit(pyspark.__version__ != "4.2.0" and "pyspark " + pyspark.__version__ + ", not 4.2.0")'
	$(SPARK42_VENV)/bin/python -m pytest --durations=10 $(SPARK42_TESTS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/bench_protocol.py
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/bench_streaming.py

clean:
	rm -rf $(VENV) $(SPARK42_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
