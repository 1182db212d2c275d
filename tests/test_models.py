"""Models: the scripted model is deterministic; the OpenAI adapter sends what the API expects."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from statekeep.errors import InvalidInputError, ModelError
from statekeep.models import (
    AsyncModel,
    Model,
    ModelResponse,
    OpenAIChatModel,
    ScriptedModel,
    ToolCall,
    ToolSpec,
)


def test_scripted_model_answers_by_turn() -> None:
    """With a list, the answer depends only on how many assistant turns the messages hold."""
    m = ScriptedModel([ModelResponse(content="first"), ModelResponse(content="second")])
    assert isinstance(m, Model)
    user = {"role": "user", "content": "hi"}
    assert m.complete([user]).content == "first"
    assert m.complete([user, {"role": "assistant", "content": "first"}, user]).content == "second"
    assert m.complete([user]).content == "first"  # same conversation, same answer
    assert len(m.calls) == 3


def test_scripted_model_needs_a_script() -> None:
    """An empty script is refused with a statekeep error."""
    with pytest.raises(InvalidInputError):
        ScriptedModel([])


def test_tool_calls_render_as_openai_assistant_message() -> None:
    """An assistant turn with tool calls renders in the OpenAI chat shape."""
    r = ModelResponse(tool_calls=(ToolCall("c1", "crm_write", {"id": 7}),))
    msg = r.to_message()
    assert msg["tool_calls"][0]["function"] == {"name": "crm_write", "arguments": '{"id": 7}'}


class _Recorder(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []
    reply: dict[str, Any] = {}
    status = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        data = json.dumps(type(self).reply).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"requests": [], "reply": {}, "status": 200})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/v1", handler
    httpd.shutdown()
    httpd.server_close()  # shutdown() stops the loop; the listening socket closes here


def test_openai_adapter_sends_messages_and_tools(server: tuple[str, type[_Recorder]]) -> None:
    """The adapter POSTs model, messages and tools to /chat/completions with the bearer key."""
    url, handler = server
    handler.reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c9",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                        }
                    ],
                }
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }
    model = OpenAIChatModel("test-model", base_url=url, api_key="sk-test")
    tool = ToolSpec("lookup", "look a lead up", {"type": "object", "properties": {"q": {"type": "string"}}})
    answer = model.complete([{"role": "user", "content": "find Ada"}], [tool])
    sent = handler.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["auth"] == "Bearer sk-test"
    assert sent["body"]["model"] == "test-model"
    assert sent["body"]["messages"] == [{"role": "user", "content": "find Ada"}]
    assert sent["body"]["tools"][0]["function"]["name"] == "lookup"
    assert answer.tool_calls == (ToolCall("c9", "lookup", {"q": "x"}),)
    assert (answer.input_tokens, answer.output_tokens) == (12, 3)


def test_openai_adapter_http_error_is_a_model_error(server: tuple[str, type[_Recorder]]) -> None:
    """An HTTP error from the endpoint raises ModelError naming the status."""
    url, handler = server
    handler.status = 500
    with pytest.raises(ModelError, match="HTTP 500"):
        OpenAIChatModel("m", base_url=url).complete([{"role": "user", "content": "x"}])


def test_openai_adapter_malformed_answer_is_a_model_error(server: tuple[str, type[_Recorder]]) -> None:
    """An answer without choices raises ModelError, not KeyError."""
    url, handler = server
    handler.reply = {"nope": True}
    with pytest.raises(ModelError, match="malformed"):
        OpenAIChatModel("m", base_url=url).complete([{"role": "user", "content": "x"}])


def test_openai_adapter_refuses_bad_base_url() -> None:
    """A base URL without a scheme is refused at construction."""
    with pytest.raises(InvalidInputError):
        OpenAIChatModel("m", base_url="localhost:8000")


def test_async_protocol_is_structural() -> None:
    """Any object with name and async acomplete() is an AsyncModel."""

    class Echo:
        name = "echo"

        async def acomplete(self, messages: Any, tools: Any = ()) -> ModelResponse:
            return ModelResponse(content=messages[-1]["content"])

    assert isinstance(Echo(), AsyncModel)
