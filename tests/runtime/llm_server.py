"""Local HTTP servers that speak the OpenAI chat-completions and the Anthropic messages APIs.

No remote model is reachable from the suite: these stand in for one, on
127.0.0.1, with what a real provider does: JSON answers, server-sent-event
streams (text deltas and tool-call argument fragments), 429 with
``Retry-After``, 500, 400 with the provider's message, and a stream that hangs
mid-answer (for crash tests). A ``responder`` decides each answer from the path
and the request body, so a conversation can be scripted like ``ScriptedModel``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One answer: a JSON body, or SSE events (``stream``), with a status and headers.

    ``hang_after``: send that many events, then hold the connection open (a provider
    stalled mid-stream), until the server stops. ``delay``: seconds between events.
    """

    status: int = 200
    body: Any = None
    stream: list[tuple[str | None, Any]] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang_after: int | None = None


Responder = Callable[[str, dict[str, Any]], Reply]


class LLMServer:
    """A threaded HTTP server on 127.0.0.1 that answers with ``responder``; it records every request."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.streaming = threading.Event()  # set once a stream has sent its first event
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append(
                    {"path": self.path, "headers": headers, "body": body, "at": time.time()}
                )
                reply = server.responder(self.path, body)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.stream is None:
                    data = json.dumps(reply.body).encode()
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                for i, (event, data) in enumerate(reply.stream):
                    if reply.hang_after is not None and i >= reply.hang_after:
                        server.stopping.wait(60)
                        return
                    text = data if isinstance(data, str) else json.dumps(data)
                    frame = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                    server.streaming.set()
                    if reply.delay:
                        time.sleep(reply.delay)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_port
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="llm-server")

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root(self) -> str:
        """The base URL an Anthropic client takes (it adds ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.port}"

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    def start(self) -> LLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def serving(responder: Responder) -> Iterator[LLMServer]:
    server = LLMServer(responder).start()
    try:
        yield server
    finally:
        server.stop()


# --- OpenAI chat completions ----------------------------------------------------------------


def openai_json(
    content: str | None = None,
    calls: list[tuple[str, str, dict[str, Any] | str]] = (),  # type: ignore[assignment]
    usage: tuple[int, int, int] = (10, 5, 0),
) -> Reply:
    """A chat-completions answer: text and/or tool calls ``(id, name, arguments)``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for cid, name, args in calls
        ]
    prompt, completion, cached = usage
    return Reply(
        body={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "mimic",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
    )


def openai_sse(
    content: str | None = None,
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int, int] = (10, 5, 0),
    *,
    delay: float = 0.0,
    hang_after: int | None = None,
) -> Reply:
    """The same answer as server-sent events: text in word deltas, tool arguments in fragments."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "mimic",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    for i, word in enumerate((content or "").split(" ") if content else []):
        events.append((None, chunk({"content": word if i == 0 else f" {word}"})))
    for index, (cid, name, args) in enumerate(calls):
        text = json.dumps(args)
        head = {"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
        events.append((None, chunk({"tool_calls": [head]})))
        for start in range(0, len(text), 7):
            part = {"index": index, "function": {"arguments": text[start : start + 7]}}
            events.append((None, chunk({"tool_calls": [part]})))
    events.append((None, chunk({}, "tool_calls" if calls else "stop")))
    prompt, completion, cached = usage
    events.append(
        (
            None,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "mimic",
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            },
        )
    )
    events.append((None, "[DONE]"))
    return Reply(stream=events, delay=delay, hang_after=hang_after)


def openai_error(status: int, message: str, *, retry_after: str | None = None) -> Reply:
    """An error answer in OpenAI's shape, optionally with ``Retry-After``."""
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return Reply(status=status, body=body, headers=headers)


# --- Anthropic messages ---------------------------------------------------------------------


def anthropic_json(
    content: str | None = None,
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int, int] = (10, 5, 0),
) -> Reply:
    """A messages-API answer: text and/or ``tool_use`` blocks."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    blocks += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
    fresh, output, cached = usage
    return Reply(
        body={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "mimic",
            "content": blocks,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": fresh, "output_tokens": output, "cache_read_input_tokens": cached},
        }
    )


def anthropic_sse(
    content: str | None = None,
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int, int] = (10, 5, 0),
    *,
    delay: float = 0.0,
    hang_after: int | None = None,
) -> Reply:
    """The same answer as Anthropic's event stream."""
    fresh, output, cached = usage
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "mimic",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": fresh, "output_tokens": 1, "cache_read_input_tokens": cached},
        },
    }
    events: list[tuple[str | None, Any]] = [("message_start", start)]
    index = 0
    if content:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
        )
        for i, word in enumerate(content.split(" ")):
            delta = {"type": "text_delta", "text": word if i == 0 else f" {word}"}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for offset, (cid, name, args) in enumerate(calls):
        block = {"type": "tool_use", "id": cid, "name": name, "input": {}}
        i = index + offset
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": block})
        )
        text = json.dumps(args)
        for s in range(0, len(text), 7):
            delta = {"type": "input_json_delta", "partial_json": text[s : s + 7]}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    stop = {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None}
    events.append(
        ("message_delta", {"type": "message_delta", "delta": stop, "usage": {"output_tokens": output}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return Reply(stream=events, delay=delay, hang_after=hang_after)


def anthropic_error(status: int, message: str, *, retry_after: str | None = None) -> Reply:
    """An error answer in Anthropic's shape."""
    headers = {} if retry_after is None else {"retry-after": retry_after}
    kind = {400: "invalid_request_error", 429: "rate_limit_error", 529: "overloaded_error"}.get(
        status, "api_error"
    )
    return Reply(
        status=status, body={"type": "error", "error": {"type": kind, "message": message}}, headers=headers
    )


def tool_results(body: dict[str, Any]) -> list[str]:
    """The tool results a request carries (either API), as text."""
    out = []
    for m in body.get("messages", []):
        if m.get("role") == "tool":
            out.append(str(m.get("content")))
        elif isinstance(m.get("content"), list):
            out += [str(b.get("content")) for b in m["content"] if b.get("type") == "tool_result"]
    return out


def openai_answer(body: dict[str, Any], content: str | None = None, calls: Any = (), **kw: Any) -> Reply:
    """The answer in the form the request asked for: an event stream or one JSON body."""
    return openai_sse(content, calls, **kw) if body.get("stream") else openai_json(content, calls)


def anthropic_answer(body: dict[str, Any], content: str | None = None, calls: Any = (), **kw: Any) -> Reply:
    """The answer in the form the request asked for: an event stream or one JSON body."""
    return anthropic_sse(content, calls, **kw) if body.get("stream") else anthropic_json(content, calls)
