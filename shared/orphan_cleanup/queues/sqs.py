"""SQS adapter (boto3 client injected)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from orphan_cleanup.queues.base import Queue


class SqsQueue(Queue):
    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def publish(self, message: BaseModel) -> None:
        self.client.send_message(QueueUrl=self.queue_url, MessageBody=message.model_dump_json())
