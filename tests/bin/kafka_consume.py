#!/usr/bin/env python3
"""Reads every record of a topic from the beginning and prints one JSON line
per record: partition, offset, key, headers (name -> text), value (text).

The integration tests' independent Kafka consumer (issue 46): kafka-python,
a client written apart from the product's producer (rskafka), installed by
scripts/setup into .tools/venv. Usage: kafka_consume.py <host:port> <topic>
"""

import json
import sys

from kafka import KafkaConsumer, TopicPartition


def main() -> int:
    brokers, topic = sys.argv[1], sys.argv[2]
    consumer = KafkaConsumer(
        bootstrap_servers=brokers,
        enable_auto_commit=False,
        consumer_timeout_ms=2000,
        request_timeout_ms=10000,
    )
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        print(f"no topic {topic}", file=sys.stderr)
        return 1
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    end = consumer.end_offsets(tps)
    # Read until every partition reached the end it had when we started.
    left = {tp for tp in tps if end[tp] > 0}
    # A debug-built test broker reading its SQLite log back after a restart
    # can take seconds per fetch on a loaded machine: only 30 s without a
    # record is a stall.
    empty = 0
    while left:
        batch = consumer.poll(timeout_ms=2000)
        if not batch:
            empty += 1
            if empty >= 15:
                print(f"stalled before the end of {sorted(t.partition for t in left)}", file=sys.stderr)
                return 1
            continue
        empty = 0
        for tp, records in batch.items():
            for r in records:
                print(json.dumps({
                    "partition": r.partition,
                    "offset": r.offset,
                    "key": r.key.decode() if r.key is not None else None,
                    "headers": {k: v.decode() for k, v in (r.headers or [])},
                    "value": r.value.decode() if r.value is not None else None,
                }))
                if r.offset + 1 >= end[tp]:
                    left.discard(tp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
