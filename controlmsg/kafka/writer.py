"""The upstream side: one upstream task writing user messages and control messages to a topic.

User messages go to the partition of their key (librdkafka's partitioner, or an explicit partition);
every watermark and end of stream goes to **every** partition, so each downstream partition hears from
each upstream task. Delivery errors are collected from delivery reports (only errors are reported, to
keep the hot path free of per-record callbacks) and raised as :class:`~controlmsg.errors.DeliveryError`
by :meth:`ControlWriter.flush`, :meth:`ControlWriter.commit` and :meth:`ControlWriter.close`.

Headers: every control message carries ``controlmsg-task``, ``controlmsg-run`` and ``controlmsg-seq``
(a per-task counter, for de-duplication and debugging). User messages name their run so that a reader
can drop user records of other runs in one of two ways: with ``run_in_envelope=True`` in their value (wire
format 2: :func:`~controlmsg.core.codec.run_tag`, no headers, the fast way), with ``data_headers=True`` in
the ``controlmsg-run`` and ``controlmsg-task`` headers (wire format 1, which readers of format 1 read
too); by default not at all (a topic of one run). The value layout never depends on headers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from controlmsg.core.codec import encode_control, encode_user, run_tag
from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.errors import DeliveryError
from controlmsg.kafka.aborts import abort_or_fence
from controlmsg.kafka.admin import wait_for_topic
from controlmsg.kafka.refusals import check_client, denied
from controlmsg.kafka.retry import init_transactions, retrying_transaction
from controlmsg.kafka.settings import for_client

__all__ = ["HEADER_RUN", "HEADER_SEQ", "HEADER_TASK", "RESERVED_HEADER_PREFIX", "ControlWriter", "fence_transactions",
           "produce_waiting"]

HEADER_TASK: Final = "controlmsg-task"
HEADER_RUN: Final = "controlmsg-run"
HEADER_SEQ: Final = "controlmsg-seq"
RESERVED_HEADER_PREFIX: Final = "controlmsg-"
"""How controlmsg's own header names begin (the run, the task, the sequence, a dead letter's reason...): a user
header named so is refused by the Spark writer, and left out of an intermediate topic's ``headers`` column."""

_POLL_EVERY: Final = 4096
# confluent-kafka's produce(topic, value, key, partition, callback, on_delivery, timestamp, headers) is called
# positionally: CPython hands a C method called with a keyword a dict to parse, which costs more than the headers
# themselves (docs/PERFORMANCE.md, "The produce call").
_ANY_PARTITION: Final = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses by key
_NOW: Final = 0  # the record's timestamp: 0 is librdkafka's "now"
_USER: Final = encode_user(b"")  # the MessageType byte of a user message
_dumps: Final = orjson.dumps  # encode_json's serde, inlined in send(): the same bytes


def produce_waiting(producer: Producer, topic: str, value: bytes | None, key: bytes | str | None = None,
                    partition: int = -1, headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
    """``producer.produce(...)``, serving delivery reports while the local queue is full instead of failing.
    Raises :class:`DeliveryError` naming the topic when librdkafka refuses the record."""
    while True:
        try:
            producer.produce(topic, value, key, partition, None, None, _NOW, headers)
            return
        except BufferError:
            producer.poll(0.05)
        except KafkaException as exc:
            raise DeliveryError(f"cannot produce to topic {topic!r}: {exc.args[0]}") from exc


def fence_transactions(config: Mapping[str, Any], transactional_ids: Sequence[str], timeout: float = 60.0) -> None:
    """Fence every producer of ``transactional_ids`` and abort its open transaction, as the next start of
    the same task would (``init_transactions``): after this returns, nothing an earlier holder of one of
    these ids still had in flight can commit. For tasks that will not start again under their id (a
    rescale to fewer tasks). Raises :class:`DeliveryError` naming the id when the broker refuses."""
    for tid in transactional_ids:
        conf = {**for_client(config, "producer"), "transactional.id": tid}
        producer = Producer(conf)
        try:
            init_transactions(producer, conf, timeout=timeout)
        except KafkaException as exc:
            raise DeliveryError(denied(config, exc.args[0], f"fence transactional id {tid!r}", repr(tid))
                                or f"cannot fence transactional id {tid!r}: {exc.args[0]}") from exc
        finally:
            producer.flush(0)


class ControlWriter:
    """Writes the envelope stream of one upstream task (``task_name`` of ``task_count``, run ``run_id``).

    ``task_count`` ``None``: a writer of user messages only, whose control messages another writer sends
    on its behalf (the driver of a Spark write does so for its tasks).
    ``config`` is passed to librdkafka untouched (``bootstrap.servers`` and anything else: security,
    batching, ``transactional.id``...), except that ``delivery.report.only.error`` defaults to true.
    ``partitions``: the topic's partition count, looked up (waiting up to ``topic_timeout`` s for the
    topic) when not given. With a ``transactional.id`` in ``config`` the writer initialises transactions
    and opens the first one; :meth:`commit` commits it and opens the next. ``generation``: the task set
    the task belongs to, on each control message (docs/PROTOCOL.md, "Generations"; 0 until a rescale).
    ``run_in_envelope``: each user message names the run in its value (:attr:`user_prefix`); raises
    ``ValueError`` with ``data_headers`` too (one way to name the run), or for a run id too long for it.

    Not thread-safe. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        task_name: str,
        task_count: int | None,
        run_id: str = "",
        partitions: int | None = None,
        data_headers: bool = False,
        topic_timeout: float = 30.0,
        generation: int = 0,
        run_in_envelope: bool = False,
    ) -> None:
        # Validates task_name, task_count and generation once, with a clear error, before any I/O.
        EndOfStreamMessage(task_name, task_count if task_count is not None else 1, run_id, generation=generation)
        if run_in_envelope and data_headers:
            raise ValueError("run_in_envelope and data_headers both set: a user message names its run one way")
        self.user_prefix: bytes = run_tag(run_id) if run_in_envelope else _USER
        """The first bytes of this writer's user messages: the type byte, and with ``run_in_envelope`` the
        run's tag. Values given to :meth:`send_encoded` begin with them."""
        self.generation = generation
        self.topic = topic
        self.task_name = task_name
        self.task_count = task_count
        self.run_id = run_id
        conf = {"delivery.report.only.error": True, **for_client(config, "producer")}
        self._errors: list[str] = []
        self._error_count = 0
        self._denied: str | None = None  # the first delivery error that is an ACL refusal, in words
        conf["on_delivery"] = self._on_delivery
        self.partitions = partitions if partitions is not None else wait_for_topic(conf, topic, topic_timeout)
        self._producer = Producer(conf)
        self._conf = conf
        self._produce_call = self._producer.produce
        self._seq = 0
        self._since_poll = 0
        self._task_b = task_name.encode()
        self._run_b = run_id.encode()
        # controlmsg-run first: a reader decides a record's run by comparing the first header (reader.same_run).
        self._data_headers: list[tuple[str, str | bytes | None]] | None = (
            [(HEADER_RUN, self._run_b), (HEADER_TASK, self._task_b)] if data_headers else None)
        self._transactional = "transactional.id" in conf
        if self._transactional:
            try:
                init_transactions(self._producer, conf, timeout=topic_timeout)
                self._producer.begin_transaction()
            except KafkaException as exc:
                tid = conf["transactional.id"]
                raise DeliveryError(
                    denied(conf, exc.args[0], f"start transactions on topic {topic!r} as transactional id {tid!r}",
                           repr(tid)) or f"cannot start transactions on topic {topic!r}: {exc.args[0]}") from exc

    # ------------------------------------------------------------------ delivery

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        # Purged records are the ones an aborted transaction threw away on purpose, not failures.
        if err is not None and err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            self._error_count += 1
            if self._denied is None:
                self._denied = denied(self._conf, err, f"write to topic {self.topic!r}", repr(self.topic))
            if len(self._errors) < 5:
                self._errors.append(f"partition {msg.partition()}: {err.str()}")

    def _produce(self, value: bytes, key: bytes | str | None, partition: int, headers: Any) -> None:
        producer = self._producer
        while True:
            try:
                # Records without headers (user messages by default) pass none: the shorter call is faster.
                if headers is None:
                    producer.produce(self.topic, value, key, partition)
                else:
                    producer.produce(self.topic, value, key, partition, None, None, _NOW, headers)
                break
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                raise DeliveryError(f"cannot produce to topic {self.topic!r}: {exc.args[0]}") from exc
        self._since_poll += 1
        if self._since_poll >= _POLL_EVERY:
            self._since_poll = 0
            producer.poll(0)

    def _raise_errors(self) -> None:
        if self._error_count:
            count, first, refused = self._error_count, "; ".join(self._errors), self._denied
            self._error_count, self._errors, self._denied = 0, [], None
            if refused is not None:  # an ACL refusal: the principal and the resource, in one line
                raise DeliveryError(f"{count} record(s) to topic {self.topic!r} were not delivered: {refused}")
            raise DeliveryError(f"{count} record(s) to topic {self.topic!r} were not delivered: {first}")

    # ------------------------------------------------------------------ user messages

    def send(self, value: Any, key: bytes | str | None = None, partition: int = -1) -> None:
        """Send one user message with the default JSON serde. Does not block unless the local queue is
        full. ``partition`` -1 lets the partitioner choose by key. Raises ``TypeError`` when ``value`` is
        not JSON-serializable, :class:`DeliveryError` when librdkafka refuses the record."""
        if partition < 0 and self._data_headers is None:
            # The common case inlined (encode_json and _produce's first branch): this is the per-record path.
            try:
                self._produce_call(self.topic, self.user_prefix + _dumps(value), key)
            except BufferError:
                self._produce(self.user_prefix + _dumps(value), key, partition, None)
                return
            except KafkaException as exc:
                raise DeliveryError(f"cannot produce to topic {self.topic!r}: {exc.args[0]}") from exc
            self._since_poll += 1
            if self._since_poll >= _POLL_EVERY:
                self._since_poll = 0
                self._producer.poll(0)
            return
        self._produce(self.user_prefix + _dumps(value), key, partition, self._data_headers)

    def send_encoded(self, values: Sequence[bytes], keys: Sequence[bytes | str | None] | None = None,
                     headers: Sequence[list[tuple[str, bytes | None]] | None] | None = None) -> None:
        """Send user messages whose values are complete envelopes already, beginning with :attr:`user_prefix`
        (:func:`~controlmsg.core.codec.encode_json_rows` and :func:`~controlmsg.core.codec.encode_user_rows`
        with ``prefix=writer.user_prefix``), ``keys[i]`` the key of ``values[i]`` (``keys`` ``None``: no keys),
        each to the partition of its key. The same records, headers and errors as :meth:`send_bytes` once per
        value, in order; only the per-record Python work is less (one loop over the batch, delivery reports
        served once per batch). Raises ``ValueError`` when ``keys`` and ``values`` differ in length,
        :class:`DeliveryError` when librdkafka refuses a record (the records before it are sent).
        ``headers[i]``, when given, are record ``i``'s own headers, sent after this writer's (which a caller
        keeps from being overridden: see :mod:`controlmsg.spark.writing`)."""
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(values)} values but {len(keys)} keys")
        if headers is not None:
            if len(headers) != len(values):
                raise ValueError(f"{len(values)} values but {len(headers)} header lists")
            own = self._data_headers or []
            for value, key, extra in zip(values, [None] * len(values) if keys is None else keys, headers,
                                         strict=True):
                self._produce(value, key, _ANY_PARTITION, [*own, *extra] if extra else own or None)
            return
        produce, topic, headers_ = self._produce_call, self.topic, self._data_headers
        try:
            # Three loops rather than one with branches: each argument more costs a confluent-kafka produce()
            # call measurably, so each loop passes only what it has, positionally (see _NOW).
            if headers_ is not None:
                for value, key in zip(values, [None] * len(values) if keys is None else keys, strict=True):
                    try:
                        produce(topic, value, key, _ANY_PARTITION, None, None, _NOW, headers_)
                    except BufferError:
                        self._produce(value, key, _ANY_PARTITION, headers_)
            elif keys is None:
                for value in values:
                    try:
                        produce(topic, value)
                    except BufferError:
                        self._produce(value, None, _ANY_PARTITION, None)
            else:
                for value, key in zip(values, keys, strict=True):
                    try:
                        produce(topic, value, key)
                    except BufferError:
                        self._produce(value, key, _ANY_PARTITION, None)
        except KafkaException as exc:
            raise DeliveryError(f"cannot produce to topic {topic!r}: {exc.args[0]}") from exc
        self._since_poll += len(values)
        if self._since_poll >= _POLL_EVERY:
            self._since_poll = 0
            self._producer.poll(0)

    def send_bytes(self, payload: bytes, key: bytes | str | None = None, partition: int = -1) -> None:
        """Send one user message whose payload is already serialized by the user's serde."""
        self._produce(self.user_prefix + payload, key, partition, self._data_headers)

    def produce_to(self, topic: str, value: bytes | None, key: bytes | str | None = None, partition: int = -1,
                   headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
        """Write a raw record (no envelope) to another ``topic`` through this writer's producer, so that
        side outputs (rejects, late records, state) commit in the same transaction as the stream. ``value``
        ``None`` is a tombstone (for compacted topics). ``partition`` -1 lets the partitioner choose.
        Delivery errors surface like the stream's own."""
        produce_waiting(self._producer, topic, value, key, partition, headers)

    # ------------------------------------------------------------------ control messages

    def _task_count(self) -> int:
        if self.task_count is None:
            raise ValueError(f"writer of task {self.task_name!r} has no task count: it sends user messages only")
        return self.task_count

    def _control_headers(self) -> list[tuple[str, bytes]]:
        self._seq += 1
        return [(HEADER_TASK, self._task_b), (HEADER_RUN, self._run_b), (HEADER_SEQ, str(self._seq).encode())]

    def send_watermark(self, timestamp: int, *, idle: bool = False) -> None:
        """Promise that no later user message of this task is older than ``timestamp`` (ms); written to
        every partition. ``idle``: the task has no input for now; readers leave it out of the minimum until
        its next watermark without ``idle``. Raises ``ValueError`` for a timestamp outside the signed 64-bit
        range."""
        value = encode_control(
            WatermarkMessage(self.task_name, self._task_count(), timestamp, self.run_id, idle=idle,
                             generation=self.generation))
        headers = self._control_headers()
        for p in range(self.partitions):
            self._produce(value, None, p, headers)

    def send_end_of_stream(self) -> None:
        """Declare that this task writes nothing more in this run; written to every partition."""
        value = encode_control(EndOfStreamMessage(self.task_name, self._task_count(), self.run_id,
                                                  generation=self.generation))
        headers = self._control_headers()
        for p in range(self.partitions):
            self._produce(value, None, p, headers)

    # ------------------------------------------------------------------ completion

    def flush(self, timeout: float = 60.0) -> None:
        """Block until everything sent is delivered. Raises :class:`DeliveryError` if any record failed
        or records are still queued after ``timeout`` seconds."""
        left = self._flush(timeout)
        self._raise_errors()
        if left:
            raise DeliveryError(f"{left} record(s) to topic {self.topic!r} still undelivered after {timeout:g} s")

    def _flush(self, timeout: float) -> int:
        """``producer.flush(timeout)`` in waits of half a second, between which a cluster that refuses the
        producer raises :class:`~controlmsg.errors.ClusterRefused` (flush serves the error callback, but
        returns only at its timeout). Returns the records still queued."""
        deadline = time.monotonic() + timeout
        while True:
            left: int = self._producer.flush(max(min(0.5, deadline - time.monotonic()), 0.0))
            if not left or time.monotonic() >= deadline:
                return left
            check_client(self._conf)

    def commit(self, timeout: float = 60.0) -> None:
        """Transactional writers: commit everything sent since the last commit and open a new transaction.
        Non-transactional writers: the same as :meth:`flush`."""
        if not self._transactional:
            self.flush(timeout)
            return
        try:
            retrying_transaction(self._producer.commit_transaction, timeout=timeout, what="commit_transaction")
            self._raise_errors()
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise DeliveryError(f"cannot commit the transaction on topic {self.topic!r}: {exc.args[0]}") from exc

    def close(self, timeout: float = 60.0) -> None:
        """Deliver (or, transactional, commit) what is pending. Raises :class:`DeliveryError`."""
        self.commit(timeout)
        if self._transactional:
            # The transaction opened by commit() is empty; aborting it ends cleanly.
            try:
                retrying_transaction(self._producer.abort_transaction, timeout=timeout, what="abort_transaction")
            except KafkaException as exc:
                raise DeliveryError(f"cannot end the transaction on topic {self.topic!r}: {exc.args[0]}") from exc

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group_metadata: Any,
                                    timeout: float = 60.0) -> None:
        """Transactional writers: commit consumer ``offsets`` (of the group ``group_metadata`` describes)
        atomically with this transaction, as in consume-transform-produce. Raises :class:`DeliveryError`."""
        try:
            retrying_transaction(lambda left: self._producer.send_offsets_to_transaction(offsets, group_metadata, left),
                                 timeout=timeout, what="send_offsets_to_transaction")
        except KafkaException as exc:
            raise DeliveryError(
                f"cannot add offsets to the transaction on topic {self.topic!r}: {exc.args[0]}"
            ) from exc

    def abort(self, timeout: float = 60.0) -> None:
        """Transactional writers: abort what was sent since the last commit (readers never see it)."""
        if self._transactional:
            retrying_transaction(self._producer.abort_transaction, timeout=timeout, what="abort_transaction")
            self._producer.begin_transaction()

    def abort_or_fence(self, timeout: float = 10.0) -> bool:
        """Transactional writers, while failing: abort what was sent since the last commit and never raise;
        when the abort fails, fence this writer's transactional id so that the transaction does not stay open
        and hold ``read_committed`` readers back, and log what happened
        (:func:`~controlmsg.kafka.aborts.abort_or_fence`). Returns whether the transaction is known to be
        ended. The writer is done afterwards (no new transaction is opened). Non-transactional: ``True``."""
        if not self._transactional:
            return True
        return abort_or_fence(self._producer, self._conf, self.topic, timeout=timeout)

    def destroy(self) -> None:
        """Destroy the producer now (librdkafka's ``rd_kafka_destroy``, which blocks until the client's
        threads have ended; confluent-kafka lets other Python threads run meanwhile) instead of whenever the
        garbage collector breaks the cycle between the producer and this writer's delivery callback, at a
        moment of some later work. Call it once done (after :meth:`close`: what is not committed or delivered
        by then is lost); the writer is unusable afterwards. :func:`~controlmsg.kafka.background.run_later`
        runs it off the caller's thread."""
        producer = self._producer
        del self._producer, self._produce_call
        self._conf.pop("on_delivery", None)
        del producer  # the last reference: the producer is destroyed here

    def __enter__(self) -> ControlWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # the exception on its way out is what matters; a failed abort is logged, not raised
            self.abort_or_fence(10.0)
