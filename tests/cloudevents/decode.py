"""Decodes the relay's messages with the CloudEvents Python SDK (PyPI `cloudevents`), as a
consumer would: the SDK's own bindings read the attributes, this script only hands them the
message and prints what the SDK made of it, one JSON line per event.

    decode.py rabbitmq AMQP_URL QUEUE COUNT   takes COUNT messages from QUEUE (AMQP 0-9-1,
                                              pika) and decodes each with the SDK's RabbitMQ
                                              binding (`ce-` headers)
    decode.py amqp                            reads AMQP 1.0 messages as JSON lines on stdin
                                              ({"content_type", "application_properties",
                                              "body_b64"}, the values as a Python AMQP 1.0
                                              client hands them: timestamps as int ms) and
                                              decodes each with the SDK's AMQP binding

Each output line: {"attributes": {...}, "data": <what the SDK parsed>, "body_b64": <the raw
body>}; `time` as the SDK's datetime in ISO 8601.
"""

import base64
import json
import sys

import pika
from cloudevents.core.bindings import amqp, rabbitmq
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent


def printed(event, body):
    attributes = {
        name: (value.isoformat() if hasattr(value, "isoformat") else value)
        for name, value in event.get_attributes().items()
    }
    line = {
        "attributes": attributes,
        "data": event.get_data(),
        "body_b64": base64.b64encode(body).decode(),
    }
    print(json.dumps(line), flush=True)


def header_text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def from_rabbitmq(url, queue, count):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    taken = 0
    for method, properties, body in channel.consume(queue, inactivity_timeout=30):
        if method is None:
            sys.exit(f"only {taken} of {count} messages arrived on {queue}")
        headers = {name: header_text(value) for name, value in (properties.headers or {}).items()}
        message = rabbitmq.RabbitMQMessage(
            headers=headers, content_type=properties.content_type, body=body
        )
        printed(rabbitmq.from_binary(message, JSONFormat(), CloudEvent), body)
        channel.basic_ack(method.delivery_tag)
        taken += 1
        if taken == count:
            break
    channel.cancel()
    connection.close()


def from_amqp10():
    for line in sys.stdin:
        seen = json.loads(line)
        body = base64.b64decode(seen["body_b64"])
        message = amqp.AMQPMessage(
            properties={"content-type": seen["content_type"]},
            application_properties=seen["application_properties"],
            application_data=body,
        )
        printed(amqp.from_binary(message, JSONFormat(), CloudEvent), body)


if __name__ == "__main__":
    if sys.argv[1] == "rabbitmq":
        from_rabbitmq(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "amqp":
        from_amqp10()
    else:
        sys.exit(__doc__)
