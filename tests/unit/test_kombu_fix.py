"""The worker survives kombu using a channel whose transport Celery already collected."""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.transport import redis as kombu_redis

from inferq.worker import kombu_fix, kombu_pipeline


def _collected_channel_with_an_unacked_message(url: str):
    conn = Connection(url)
    channel = conn.default_channel
    queue = conn.SimpleQueue("inferq-kombu-fix-test", channel=channel)
    queue.put({"x": 1})
    message = queue.get(timeout=2)  # delivered, not acked
    assert channel.qos._delivered
    # what Celery's consumer does on a lost broker connection: the transport's client is dropped
    # and the channel's pools are disconnected
    conn._do_close_transport()
    channel._disconnect_pools()
    return channel, message


@pytest.mark.parametrize("use", ["close", "ack"])
def test_a_collected_channel_fails_without_the_guard(unit_redis, monkeypatch, use: str) -> None:
    for name in ("restore_unacked", "ack"):
        method = getattr(kombu_redis.QoS, name)
        monkeypatch.setattr(kombu_redis.QoS, name, getattr(method, "__wrapped__", method))
    channel, message = _collected_channel_with_an_unacked_message(unit_redis.url)
    with pytest.raises(AttributeError, match="NoneType"):
        channel.close() if use == "close" else message.ack()


@pytest.mark.parametrize("use", ["close", "ack"])
def test_with_the_guard_a_collected_channel_closes_and_acks(unit_redis, use: str) -> None:
    kombu_fix.install()
    channel, message = _collected_channel_with_an_unacked_message(unit_redis.url)
    assert kombu_fix.transport_gone(channel.qos)
    if use == "ack":
        message.ack()
        assert message.acknowledged and message.delivery_tag in channel.qos._dirty  # forgotten locally
    channel.close()


def test_the_guard_leaves_a_live_channel_alone(unit_redis) -> None:
    kombu_fix.install()
    conn = Connection(unit_redis.url)
    queue = conn.SimpleQueue("inferq-kombu-fix-live", channel=conn.default_channel)
    queue.put({"x": 2})
    message = queue.get(timeout=2)
    channel = conn.default_channel
    kombu_pipeline.flush(channel.qos)  # its bookkeeping may be sent without waiting (kombu_pipeline)
    assert channel.client.hexists(channel.unacked_key, message.delivery_tag)
    message.ack()
    assert not kombu_fix.transport_gone(channel.qos)
    kombu_pipeline.flush(channel.qos)
    assert not channel.client.hexists(channel.unacked_key, message.delivery_tag)  # really acked in Redis
    conn.close()
