"""What a reading task does with the bad records its batches set aside: logs them, and under
DROPMALFORMED writes them to the dead-letter topic before Spark gets the batch they came out of. Which
records are bad, and what a batch becomes of them, is :mod:`controlmsg.spark.batches`; this is the
user's side of it, the same for every reader of ``format("controlmsg")``.

**Bad records** are user records that do not fit the DataFrame: a value that is not JSON or not a JSON
object, a field that does not fit its type, a field declared ``NOT NULL`` that is missing or null, a key
(``_key``/``key`` string) or raw value (``value`` string) that is not UTF-8. Option ``mode``, in the sense
of Spark's JSON and CSV sources:

* ``FAILFAST`` (default): the task fails with a :class:`~controlmsg.errors.ReadError` naming topic,
  partition and offset of the first bad record it reads, and the reason.
* ``PERMISSIVE``: every row is kept. A value that is not a JSON object gives null JSON fields (``_partition``,
  ``_offset`` and ``_key`` are filled as for any record); a field that
  does not fit is null (the others are kept); a key that is not UTF-8 is given with those bytes written
  ``\\xNN``. The schema must declare the corrupt-record column (``columnNameOfCorruptRecord``, default
  ``_corrupt_record``), null for good records; for a bad one it holds the value (the upstream serde's
  bytes): as they are in a ``binary`` column, as UTF-8 text with bytes that are not UTF-8 written
  ``\\xNN`` in a ``string`` column. Without that column PERMISSIVE is refused, since the bad content would
  be lost (Spark's own sources drop it silently), and so it is for a declared schema of the raw columns with
  a string ``key`` or ``value`` (read them as binary, as a read without a schema does: then no record is bad).
* ``DROPMALFORMED``, or just the option ``deadLetterTopic``: the row is left out and the record written to
  the dead-letter topic unchanged (the whole envelope, key and headers) plus the headers of
  :mod:`controlmsg.kafka.deadletter` (reason, source topic, partition, offset): the format ``controlmsg
  consume --dead-letter-topic`` writes. The topic must exist: planning fails otherwise, before any task.
  A task has the broker acknowledge its dead letters before it hands Spark the batch they came out of, so
  no record counts as read that is not in one place or the other. A retried task or a replayed
  micro-batch writes its dead letters again: they are at least once (de-duplicate on the source topic,
  partition and offset headers).

Each reading task logs its first ten bad records (partition, offset, reason, where they went) and a count.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from controlmsg.errors import Location
from controlmsg.kafka.deadletter import DeadLetters, check_dead_letter_topic
from controlmsg.kafka.periodic_log import Progress
from controlmsg.spark.batches import Built
from controlmsg.spark.options import ReadOptions

__all__ = ["SetAside", "check_dead_letters"]

_LOGGED_BAD: Final = 10


def check_dead_letters(opts: ReadOptions) -> None:
    """At planning time, on the driver: raises :class:`~controlmsg.errors.ControlMsgError` when option
    ``deadLetterTopic`` names a topic that does not exist (waiting up to ``timeout``, else 10 s); does
    nothing without the option."""
    if opts.dead_letter_topic is not None:
        check_dead_letter_topic(dict(opts.config), opts.dead_letter_topic, opts.timeout or 10.0)


class SetAside:
    """What one reading task does with the bad records its batches set aside: logs the first
    :data:`_LOGGED_BAD` (topic, partition, offset, reason) and counts the rest; under DROPMALFORMED writes
    each to the dead-letter topic, and has the broker acknowledge them before the batch they were taken
    out of goes to Spark, so no record counts as handled that was not."""

    def __init__(self, opts: ReadOptions, progress: Progress) -> None:
        self.opts = opts
        self.progress = progress
        self.count = 0
        self._letters: DeadLetters | None = None

    def take(self, built: Built) -> pa.RecordBatch | None:
        """The batch of ``built`` once its bad records are handled (``None`` if it has no row left).
        Blocks until the dead-letter topic acknowledged them; raises DeliveryError when it did not."""
        batch, aside = built
        if aside:
            topic = self.opts.topic
            dead_letters = self.opts.dead_letter_topic
            for record, reason in aside:
                self.count += 1
                if self.count <= _LOGGED_BAD:
                    where = (f"written to dead-letter topic {dead_letters!r}" if dead_letters is not None
                             else f"kept in column {self.opts.corrupt_column!r}")
                    self.progress.log(f"bad record at partition {record.partition} offset {record.offset}: "
                                      f"{reason}; {where}")
                if dead_letters is not None:
                    if self._letters is None:
                        self._letters = DeadLetters(dict(self.opts.config), dead_letters)
                    msg = record.message
                    value = msg.value() if msg is not None else bytes([0]) + record.payload
                    self._letters.send(value, record.key, msg.headers() if msg is not None else None, reason,
                                       Location(topic, record.partition, record.offset))
            if self._letters is not None:
                self._letters.flush(topic)
        return batch if batch.num_rows else None

    def finish(self) -> None:
        """At the end of a task that read everything: one line with the count, if any was bad."""
        if self.count > _LOGGED_BAD:
            self.progress.log(f"{self.count} bad records in all ({self.count - _LOGGED_BAD} not logged one by one)")

    def close(self) -> None:
        if self._letters is not None:
            self._letters.close()
