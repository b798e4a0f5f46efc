"""What the Files and Batches APIs answer, in OpenAI's shapes, and the ids they use."""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from sluicegate.batches.batch_backend import Counts, Record

STATUS_TIMES = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses of a batch that is not over yet."""


def new_id(prefix: str) -> str:
    """A fresh id such as ``file-…``, ``batch_…`` or ``batch_req_…`` (96 random bits)."""
    return f"{prefix}{secrets.token_hex(12)}"


def file_object(row: Record) -> dict[str, Any]:
    """A ``files`` row as OpenAI's file object."""
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "expires_at": row.get("expires_at"),
        "status_details": None,
    }


def batch_object(row: Record, counts: Counts) -> dict[str, Any]:
    """A stored batch and its progress as OpenAI's batch object."""
    errors = orjson.loads(row["errors"]) if row["errors"] else None
    answer: dict[str, Any] = {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": None if errors is None else {"object": "list", "data": errors},
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "request_counts": {
            "total": row["total"],
            "completed": counts.completed,
            "failed": counts.failed,
        },
        "usage": {
            "input_tokens": counts.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": counts.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts.prompt_tokens + counts.completion_tokens,
        },
        "metadata": orjson.loads(row["metadata"]) if row["metadata"] else None,
    }
    for name in STATUS_TIMES:
        answer[name] = row[name]
    return answer


def output_line(custom_id: str | None, status: int, request_id: str, body: Any) -> bytes:
    """One line of an output or error file: the engine's (or gateway's) answer to a line,
    ``body`` already parsed (text when it was not JSON)."""
    return orjson.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        }
    )


def error_line(custom_id: str | None, code: str, message: str) -> bytes:
    """One line of an error file for a line that got no answer (malformed, expired, cancelled)."""
    return orjson.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )
