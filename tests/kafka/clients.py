"""Real Kafka clients for tests/tests/kafka_clients.rs (docs/kafka.md): confluent-kafka (librdkafka
2.x in its wheel) and kafka-python (its own protocol code), run by the venv that ./scripts/test
makes. Each command prints one line per event on stdout, flushed, for the Rust test to read.

  idempotent BOOTSTRAP TOPIC N          produce values 0..N-1 (key = value % 50) with
                                        enable.idempotence and acks=all; "acked I" per delivery
  member BOOTSTRAP GROUP TOPIC DELAY_MS  a group member: "assigned P,P", "revoked", "rec P O V";
                                        commits synchronously every 50 records, on revoke and
                                        when idle
  kafka_python BOOTSTRAP TOPIC N        produce N, consume them in a group, commit, read the
                                        commit back: "ok COUNT COMMITTED"
"""

import sys
import time


def out(*words):
    print(*words, flush=True)


def idempotent(bootstrap, topic, n):
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            # Across a broker restart: keep retrying rather than give a record up.
            "message.timeout.ms": 120000,
            "reconnect.backoff.max.ms": 500,
            "linger.ms": 5,
        }
    )

    def acked(err, msg):
        if err is not None:
            out("failed", msg.value().decode(), err)
        else:
            out("acked", msg.value().decode())

    for i in range(int(n)):
        while True:
            try:
                p.produce(topic, key=str(i % 50), value=str(i), on_delivery=acked)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    left = p.flush(120)
    out("done", left)


def member(bootstrap, group, topic, delay_ms):
    from confluent_kafka import Consumer

    delay = float(delay_ms) / 1000.0
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    pending = []

    def commit():
        if pending:
            try:
                c.commit(asynchronous=False)
            except Exception as e:  # a commit refused during a rebalance is retried later
                out("commit-failed", str(e).replace(" ", "_"))
            pending.clear()

    def on_assign(consumer, parts):
        out("assigned", ",".join(str(p.partition) for p in parts) or "-")

    def on_revoke(consumer, parts):
        commit()
        out("revoked")

    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while True:
        m = c.poll(0.5)
        if m is None:
            commit()  # idle: what was consumed is committed
            continue
        if m.error():
            out("error", str(m.error()).replace(" ", "_"))
            continue
        out("rec", m.partition(), m.offset(), m.value().decode())
        pending.append(m)
        if delay:
            time.sleep(delay)
        if len(pending) >= 50:
            commit()


def kafka_python(bootstrap, topic, n):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    n = int(n)
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(n):
        p.send(topic, key=b"k%d" % i, value=b"value-%d" % i)
    p.flush()
    p.close()
    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id="kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10000,
    )
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == n:
            break
    assert got == [b"value-%d" % i for i in range(n)], got[:5]
    c.commit()
    committed = c.committed(TopicPartition(topic, 0))
    c.close()
    out("ok", len(got), committed)


def groups(bootstrap, group):
    """ListGroups and DescribeGroups through confluent-kafka's AdminClient."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for g in admin.list_consumer_groups(request_timeout=10).result().valid:
        out("listed", g.group_id, g.state.name)
    d = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    out("described", d.group_id, d.state.name, d.partition_assignor or "-", len(d.members))
    for m in d.members:
        parts = sorted(tp.partition for tp in m.assignment.topic_partitions)
        out("member", m.client_id or "-", ",".join(str(p) for p in parts) or "-")
    out("done")


if __name__ == "__main__":
    commands = {
        "idempotent": idempotent,
        "member": member,
        "kafka_python": kafka_python,
        "groups": groups,
    }
    commands[sys.argv[1]](*sys.argv[2:])
