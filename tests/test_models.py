"""Models: the scripted model is deterministic; the OpenAI and Anthropic adapters speak their APIs.

The adapters run on the official clients against local servers that mimic each API
(``tests/runtime/llm_server.py``): JSON answers, event streams, 429 with Retry-After,
500, 400 with the provider's message, tool calls with arguments.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from statekeep.errors import ConfigError, InvalidInputError, MissingDependencyError, ModelError
from statekeep.models import (
    INVALID_ARGUMENTS,
    AnthropicModel,
    AsyncModel,
    AsyncStreamingModel,
    Model,
    ModelResponse,
    OpenAIChatModel,
    ScriptedModel,
    StreamingModel,
    ToolCall,
    ToolSpec,
    openai_to_anthropic,
    parse_retry_after,
)
from tests.runtime.llm_server import (
    Reply,
    anthropic_error,
    anthropic_json,
    anthropic_sse,
    openai_error,
    openai_json,
    openai_sse,
    serving,
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


# --- the adapters on the official clients, against local servers that speak each API ---------

USER: list[dict[str, Any]] = [{"role": "user", "content": "find Ada"}]
LOOKUP = ToolSpec("lookup", "Look a lead up.", {"type": "object", "properties": {"q": {"type": "string"}}})
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You find leads."},
    {"role": "system", "content": "Current task state (pinned): find Ada"},
    {"role": "user", "content": "find Ada"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "Ada"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"found": true}'},
]


def _script(*replies: Reply):  # type: ignore[no-untyped-def]
    queue = list(replies)
    return lambda path, body: queue.pop(0)


def test_openai_streams_text_deltas_and_tool_call_fragments() -> None:
    """stream() yields the text as it arrives and ends with the whole answer, arguments reassembled."""
    answer = openai_sse("Looking her up", [("c9", "lookup", {"q": "Ada Lovelace"})], usage=(30, 7, 12))
    with serving(_script(answer)) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        assert isinstance(model, StreamingModel)
        chunks = list(model.stream(USER, [LOOKUP]))
        body = server.bodies()[0]
    assert chunks[:-1] == ["Looking", " her", " up"]
    final = chunks[-1]
    assert isinstance(final, ModelResponse)
    assert final.content == "Looking her up"
    assert final.tool_calls == (ToolCall("c9", "lookup", {"q": "Ada Lovelace"}),)
    assert final.usage == {"prompt": 30, "completion": 7, "cached": 12}
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_openai_async_complete_and_stream() -> None:
    """acomplete() and astream() speak the same API, on the caller's event loop."""
    with serving(_script(openai_json("one"), openai_sse("two words"))) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        assert isinstance(model, AsyncStreamingModel)

        async def main() -> tuple[ModelResponse, list[object]]:
            first = await model.acomplete(USER)
            return first, [c async for c in model.astream(USER)]

        first, chunks = asyncio.run(main())
    assert first.content == "one"
    assert chunks[:-1] == ["two", " words"]
    assert isinstance(chunks[-1], ModelResponse)
    assert chunks[-1].content == "two words"


def test_openai_options_reach_every_request() -> None:
    """temperature, max_tokens, tool_choice (a tool name) and extra_body go into the request."""
    with serving(_script(openai_json("ok"), openai_json("ok"))) as server:
        model = OpenAIChatModel(
            "m",
            base_url=server.url,
            temperature=0.2,
            max_tokens=64,
            tool_choice="lookup",
            extra_body={"seed": 7},
            api_key="sk-local",
        )
        model.complete(USER, [LOOKUP])
        OpenAIChatModel("m", base_url=server.url, tool_choice="required").complete(USER, [LOOKUP])
        first, second = server.requests
    assert first["headers"]["authorization"] == "Bearer sk-local"
    body = first["body"]
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.2, 64, 7)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert second["body"]["tool_choice"] == "required"
    assert "temperature" not in second["body"]


def test_openai_errors_carry_the_providers_message_and_their_class() -> None:
    """429 and 5xx are retryable (Retry-After kept), 400 is not and says why, in the provider's words."""
    replies = (
        openai_error(429, "Rate limit reached for requests", retry_after="7"),
        openai_error(500, "The server had an error"),
        openai_error(400, "Invalid schema for function 'send_quote': 'amount' is not valid"),
        openai_error(401, "Incorrect API key provided"),
    )
    errors = []
    with serving(_script(*replies)) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        for _ in replies:
            with pytest.raises(ModelError) as caught:
                model.complete(USER)
            errors.append(caught.value)
        assert len(server.requests) == 4  # the client itself never retries: the runtime does, durably
    limited, broken, invalid, denied = errors
    assert (limited.status, limited.retryable, limited.retry_after) == (429, True, 7.0)
    assert "Rate limit reached" in str(limited)
    assert (broken.status, broken.retryable) == (500, True)
    assert (invalid.status, invalid.retryable) == (400, False)
    assert "HTTP 400" in str(invalid)
    assert "Invalid schema for function 'send_quote'" in str(invalid)
    assert (denied.status, denied.retryable) == (401, False)


def test_an_unreachable_server_is_a_retryable_model_error() -> None:
    """A refused connection is transient: the run will try again."""
    with serving(_script()) as server:
        url = server.url
    with pytest.raises(ModelError, match="cannot reach") as caught:
        OpenAIChatModel("m", base_url=url, timeout=5).complete(USER)
    assert caught.value.retryable


def test_a_cut_stream_is_a_retryable_model_error() -> None:
    """A stream that ends before its finish reason is not an answer: it is retried, never recorded."""
    cut = openai_sse("half an", [])
    cut.stream = cut.stream[:2]  # type: ignore[index]
    with serving(_script(cut)) as server, pytest.raises(ModelError, match="before the answer") as caught:
        list(OpenAIChatModel("m", base_url=server.url).stream(USER))
    assert caught.value.retryable


def test_arguments_that_are_not_json_are_kept_for_the_error() -> None:
    """A model that emits broken argument JSON does not break the parse: the runtime answers it."""
    with serving(_script(openai_json(None, [("c1", "lookup", '{"q": "Ad')]))) as server:
        answer = OpenAIChatModel("m", base_url=server.url).complete(USER, [LOOKUP])
    assert answer.tool_calls[0].arguments == {INVALID_ARGUMENTS: '{"q": "Ad'}


def test_anthropic_converts_the_conversation_and_parses_tool_use() -> None:
    """System messages join ``system``; tool calls and results become blocks; usage counts the cache."""
    answer = anthropic_json("Found her.", [("toolu_1", "lookup", {"q": "Ada"})], usage=(20, 9, 100))
    with serving(_script(answer)) as server:
        model = AnthropicModel("claude-x", base_url=server.root, max_tokens=300, tool_choice="lookup")
        result = model.complete(CONVERSATION, [LOOKUP])
        sent = server.requests[0]
    assert sent["path"] == "/v1/messages"
    body = sent["body"]
    assert body["system"] == "You find leads.\n\nCurrent task state (pinned): find Ada"
    assert body["max_tokens"] == 300
    assert body["tools"] == [
        {"name": "lookup", "description": "Look a lead up.", "input_schema": LOOKUP.parameters}
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": "Ada"}}
    ]
    assert body["messages"][2]["content"][0]["type"] == "tool_result"
    assert result.content == "Found her."
    assert result.tool_calls == (ToolCall("toolu_1", "lookup", {"q": "Ada"}),)
    assert result.usage == {"prompt": 120, "completion": 9, "cached": 100}


def test_anthropic_streams_sync_and_async() -> None:
    """The event stream yields text deltas, then the whole message with its tool call."""
    replies = [anthropic_sse("Let me look", [("toolu_2", "lookup", {"q": "Ada Lovelace"})]) for _ in range(2)]
    with serving(_script(*replies)) as server:
        model = AnthropicModel("claude-x", base_url=server.root)
        chunks = list(model.stream(CONVERSATION, [LOOKUP]))

        async def main() -> list[object]:
            return [c async for c in model.astream(CONVERSATION, [LOOKUP])]

        achunks = asyncio.run(main())
    for got in (chunks, achunks):
        assert got[:-1] == ["Let", " me", " look"]
        final = got[-1]
        assert isinstance(final, ModelResponse)
        assert final.tool_calls == (ToolCall("toolu_2", "lookup", {"q": "Ada Lovelace"}),)
        assert final.content == "Let me look"


def test_anthropic_errors_are_classified() -> None:
    """429 (with retry-after) and 529 are retryable; 400 carries the API's message and is not."""
    replies = (
        anthropic_error(429, "Number of request tokens has exceeded your rate limit", retry_after="3"),
        anthropic_error(529, "Overloaded"),
        anthropic_error(400, "tools.0.input_schema: JSON schema is invalid"),
    )
    errors = []
    with serving(_script(*replies)) as server:
        model = AnthropicModel("claude-x", base_url=server.root)
        for _ in replies:
            with pytest.raises(ModelError) as caught:
                model.complete(CONVERSATION)
            errors.append(caught.value)
    assert [(e.status, e.retryable) for e in errors] == [(429, True), (529, True), (400, False)]
    assert errors[0].retry_after == 3.0
    assert "JSON schema is invalid" in str(errors[2])


def test_a_missing_extra_names_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the openai (anthropic) package, the adapter says which extra to install."""
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(MissingDependencyError, match=r"statekeep\[openai\]"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(MissingDependencyError, match=r"statekeep\[anthropic\]"):
        AnthropicModel("m", base_url="http://127.0.0.1:1")


def test_the_real_apis_need_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without base_url and without a key, construction fails naming the variable, before any request."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-x")


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "2"}, 2.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date in the past: now
        ({"Retry-After": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], seconds: float | None) -> None:
    """Retry-After in seconds, milliseconds or as an HTTP date."""
    assert parse_retry_after(headers) == seconds


def test_scripted_model_streams_word_by_word() -> None:
    """The scripted model streams too, so a stream can be shown without a network."""
    chunks = list(ScriptedModel([ModelResponse(content="a b  c")]).stream(USER))
    assert chunks[:-1] == ["a", " b", " ", " c"]
    assert "".join(c for c in chunks if isinstance(c, str)) == "a b  c"


def test_openai_to_anthropic_merges_turns_and_drops_empty_text() -> None:
    """Consecutive user turns merge; an assistant turn with only tool calls has no empty text block."""
    system, turns = openai_to_anthropic([*CONVERSATION, {"role": "user", "content": "and Bob?"}])
    assert system.startswith("You find leads.")
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "text"]
    assert all(b.get("text") != "" for t in turns for b in t["content"])
