"""kombu's unacked bookkeeping is sent without waiting, applied in order, and still read back by
every path that restores messages (worker/kombu_pipeline.py), against a real Redis."""

from __future__ import annotations

import logging

import pytest
from kombu import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

from inferq.worker import kombu_fix, kombu_pipeline


@pytest.fixture
def conn(unit_redis):
    kombu_pipeline.install()
    kombu_fix.install()
    c = Connection(unit_redis.url)
    yield c
    c.close()


def _delivered(conn: Connection, name: str, body: dict):
    queue = conn.SimpleQueue(name, channel=conn.default_channel)
    queue.put(body)
    return queue, queue.get(timeout=2)


def test_the_append_is_sent_without_waiting_and_lands(conn) -> None:
    _, message = _delivered(conn, "kp-append", {"x": 1})
    channel = conn.default_channel
    writer = channel.qos._inferq_writer
    assert writer.pending == 2  # ZADD + HSET sent, their replies not waited for
    kombu_pipeline.flush(channel.qos)
    assert writer.pending == 0
    assert channel.client.hexists(channel.unacked_key, message.delivery_tag)
    assert channel.client.zscore(channel.unacked_index_key, message.delivery_tag) is not None


def test_an_ack_sent_right_after_its_append_leaves_nothing(conn) -> None:
    _, message = _delivered(conn, "kp-ack", {"x": 2})
    message.ack()  # before any reply of the append was read
    channel = conn.default_channel
    kombu_pipeline.flush(channel.qos)
    assert not channel.client.hexists(channel.unacked_key, message.delivery_tag)
    assert channel.client.zscore(channel.unacked_index_key, message.delivery_tag) is None
    assert message.acknowledged and message.delivery_tag in channel.qos._dirty  # forgotten locally


def test_closing_the_channel_restores_a_message_whose_append_was_not_read_yet(conn, unit_redis) -> None:
    queue, message = _delivered(conn, "kp-restore", {"x": 3})
    assert conn.default_channel.qos._inferq_writer.pending == 2
    conn.close()  # restore_unacked reads the unacked hash: it must see the append
    other = Connection(unit_redis.url)
    try:
        again = other.SimpleQueue("kp-restore").get(timeout=2)
        assert again.payload == {"x": 3}
        again.ack()
    finally:
        other.close()


def test_a_write_that_cannot_be_sent_raises_a_connection_error(conn, monkeypatch) -> None:
    queue, first = _delivered(conn, "kp-send-error", {"x": 4})
    writer = conn.default_channel.qos._inferq_writer

    def broken(*_a, **_k):
        raise RedisConnectionError("link down")

    monkeypatch.setattr(writer.conn, "send_packed_command", broken)
    with pytest.raises(RedisConnectionError):  # as kombu's own write raises: Celery reconnects on it
        first.ack()
    assert writer.pending == 0


def test_replies_lost_with_the_connection_are_logged_and_writes_go_on(conn, monkeypatch, caplog) -> None:
    queue, first = _delivered(conn, "kp-read-error", {"x": 5})
    channel = conn.default_channel
    writer = channel.qos._inferq_writer

    def lost(*_a, **_k):
        raise RedisConnectionError("connection reset")

    monkeypatch.setattr(writer.conn, "read_response", lost)
    with caplog.at_level(logging.WARNING, logger="inferq.worker.kombu_pipeline"):
        kombu_pipeline.flush(channel.qos)
    assert writer.pending == 0 and "connection lost" in caplog.text
    monkeypatch.undo()
    first.ack()  # a new socket for the next write
    kombu_pipeline.flush(channel.qos)
    assert not channel.client.hexists(channel.unacked_key, first.delivery_tag)


def test_a_channel_without_its_pool_uses_kombus_own_code(conn) -> None:
    _, message = _delivered(conn, "kp-gone", {"x": 6})
    channel = conn.default_channel
    conn._do_close_transport()
    channel._disconnect_pools()
    assert kombu_pipeline.writer(channel.qos) is None
    message.ack()  # kombu_fix's guard: forgotten locally, nothing raised
    assert message.acknowledged
