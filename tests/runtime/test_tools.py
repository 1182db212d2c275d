"""Tools: the schema comes from the signature, arguments are validated before the ledger, errors reach
the model (or fail the run, or wait for a person) as each tool says."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pydantic
import pytest

from statekeep.config import Settings
from statekeep.errors import InvalidInputError
from statekeep.memory import FakeEmbedder
from statekeep.models import INVALID_ARGUMENTS, ModelResponse, OpenAIChatModel, ScriptedModel, ToolCall
from statekeep.runtime import Agent, AgentTool, Runtime, tool
from statekeep.workflow import RetryPolicy, RunStatus
from tests.runtime.llm_server import openai_answer, serving, tool_results


class Address(pydantic.BaseModel):
    street: str
    city: str


def send_quote(
    key: str,
    to: str,
    amount: int,
    currency: Literal["EUR", "USD"] = "EUR",
    ship_to: Address | None = None,
    note: Annotated[str, pydantic.Field(max_length=20, description="a short note")] = "",
) -> dict[str, Any]:
    """Email a quote to a customer.

    Args:
        to: the customer's email address
        amount: the total, in whole units
            of the currency
        currency: ISO 4217 code
    """
    return {"to": to, "amount": amount, "currency": currency, "city": ship_to.city if ship_to else None}


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    """Types, required fields, defaults, enums, nested models and descriptions; the key is not shown."""
    spec = AgentTool("send_quote", send_quote).spec
    assert spec.description == "Email a quote to a customer."
    schema = spec.parameters
    props = schema["properties"]
    assert set(props) == {"to", "amount", "currency", "ship_to", "note"}
    assert schema["required"] == ["to", "amount"]
    assert props["to"] == {"type": "string", "description": "the customer's email address"}
    assert props["amount"] == {"type": "integer", "description": "the total, in whole units of the currency"}
    assert props["currency"]["enum"] == ["EUR", "USD"]
    assert props["note"]["description"] == "a short note"
    assert props["note"]["maxLength"] == 20
    assert schema["additionalProperties"] is False
    assert "Address" in schema["$defs"]
    assert "title" not in schema
    assert "title" not in props["to"]


def test_an_explicit_schema_still_overrides_what_the_model_is_shown() -> None:
    """parameters= is shown as given; validation still follows the signature."""
    shown = {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}
    t = AgentTool("send_quote", send_quote, "Send it.", parameters=shown)
    assert t.spec.parameters == shown
    assert t.spec.description == "Send it."
    assert "amount: missing" in (t.bad_arguments({"to": "a@b"}) or "")


def test_arguments_are_validated_and_coerced() -> None:
    """What the ledger records is the validated JSON; a model's mistakes are explained in words."""
    t = tool(send_quote)
    assert t.name == "send_quote"
    assert t.check_arguments({"to": "a@b", "amount": "900"}) == {"to": "a@b", "amount": 900}
    problems = {
        "amount: missing": {"to": "a@b"},
        "amount: Input should be a valid integer": {"to": "a@b", "amount": "lots"},
        "colour: no such argument": {"to": "a@b", "amount": 1, "colour": "red"},
        "currency: Input should be 'EUR' or 'USD'": {"to": "a@b", "amount": 1, "currency": "GBP"},
        "ship_to.city: missing": {"to": "a@b", "amount": 1, "ship_to": {"street": "x"}},
        "not a JSON object": {INVALID_ARGUMENTS: '{"to": '},
    }
    for expected, arguments in problems.items():
        with pytest.raises(InvalidInputError, match=expected.replace("(", r"\(")):
            t.check_arguments(arguments)
    nested = t.check_arguments({"to": "a@b", "amount": 1, "ship_to": {"street": "1 Main", "city": "Oslo"}})
    assert t.invoke("key-1", nested)["city"] == "Oslo"  # the function gets the model back, not a dict


def test_tools_that_cannot_take_a_key_or_named_arguments_are_refused() -> None:
    """The first parameter is the idempotency key; positional-only arguments cannot come from a model."""

    def no_params() -> None: ...

    def positional(key: str, a: int, /) -> None: ...

    def kwargs(key: str, **rest: Any) -> dict[str, Any]:
        return rest

    with pytest.raises(InvalidInputError, match="idempotency key"):
        AgentTool("t", no_params)
    with pytest.raises(InvalidInputError, match="positional-only"):
        AgentTool("t", positional)
    assert AgentTool("t", kwargs).check_arguments({"anything": 1}) == {"anything": 1}


def test_a_tool_whose_first_parameter_is_not_a_key_or_whose_name_providers_refuse_is_refused() -> None:
    """``lambda city: ...`` would take the idempotency key as the city and show the model no
    parameters; a name with spaces is refused by every model provider at the first call."""
    with pytest.raises(InvalidInputError, match="named key") as refused:
        AgentTool("lookup", lambda city: {"city": city})
    assert "def tool(key, city" in str(refused.value)
    for bad in ("bad name!", "x" * 65, "dot.name"):
        with pytest.raises(InvalidInputError, match="letters, digits") as named:
            AgentTool(bad, lambda key, city: city)
        assert named.value.field == "name"

    def lookup(idempotency_key: str, city: str) -> str:
        return city

    for good in ("lookup", "get-weather_2", "x" * 64):
        assert AgentTool(good, lookup).spec.parameters["required"] == ["city"]
    assert AgentTool("t", lambda key: "ok").spec.parameters["properties"] == {}


def _tool_answers(script: Callable[[list[str]], ModelResponse]) -> ScriptedModel:
    """A scripted model that sees the tool results so far (as text)."""

    def answer(messages: Any) -> ModelResponse:
        return script([str(m["content"]) for m in messages if m.get("role") == "tool"])

    return ScriptedModel(answer)


def _open(settings: Settings, model: Any) -> Runtime:
    return Runtime.open(settings, model=model, embedder=FakeEmbedder())


def test_the_model_is_told_the_real_schema_and_bad_arguments_never_reach_the_ledger(
    settings: Settings,
) -> None:
    """Against a server that speaks the OpenAI API: the tool's schema is in the request; a call with
    bad arguments is answered with the reason, never recorded; the corrected call runs once."""
    calls: list[dict[str, Any]] = []

    def quote(key: str, to: str, amount: int) -> dict[str, Any]:
        """Email a quote.

        Args:
            to: the customer's email address
            amount: the total in EUR
        """
        calls.append({"key": key, "to": to, "amount": amount})
        return {"sent": True}

    def responder(path: str, body: dict[str, Any]) -> Any:
        results = tool_results(body)
        if not results:
            return openai_answer(
                body, None, [("c1", "quote", {"to": "ada@example.com", "amount": "nine hundred"})]
            )
        if len(results) == 1:
            return openai_answer(body, None, [("c2", "quote", {"to": "ada@example.com", "amount": 900})])
        return openai_answer(body, "Sent.")

    with serving(responder) as server:
        rt = _open(settings, OpenAIChatModel("mimic", base_url=server.url))
        try:
            run = rt.run(
                Agent("q", system="s", tools=[tool(quote)], memory_k=0), "q-1", owner="o", task="quote"
            )
            ledger = rt.engine.store.tool_calls("q-1")
        finally:
            rt.close()
        first = server.bodies()[0]
        second = server.bodies()[1]
    assert run.status is RunStatus.COMPLETED
    fn = first["tools"][0]["function"]
    assert fn["description"] == "Email a quote."
    assert fn["parameters"]["properties"]["amount"] == {"type": "integer", "description": "the total in EUR"}
    assert fn["parameters"]["required"] == ["to", "amount"]
    assert "amount: Input should be a valid integer" in tool_results(second)[0]
    assert len(ledger) == 1
    assert ledger[0].kwargs == {"to": "ada@example.com", "amount": 900}
    assert calls == [{"key": ledger[0].key, "to": "ada@example.com", "amount": 900}]


def test_a_failing_tool_is_answered_to_the_model_and_transient_errors_are_retried(settings: Settings) -> None:
    """A tool that raises does not fail the run: the model sees the error. A timeout is first retried
    in process, with the same idempotency key."""
    keys: list[str] = []

    def crm(key: str, lead: str) -> dict[str, Any]:
        raise RuntimeError("CRM API returned 503")

    def flaky(key: str, lead: str) -> dict[str, Any]:
        keys.append(key)
        if len(keys) < 3:
            raise TimeoutError("read timed out")
        return {"lead": lead, "score": 7}

    def script(results: list[str]) -> ModelResponse:
        if not results:
            return ModelResponse(
                tool_calls=(ToolCall("c1", "crm", {"lead": "ada"}), ToolCall("c2", "flaky", {"lead": "ada"}))
            )
        return ModelResponse(content=" | ".join(results))

    agent = Agent(
        "t",
        system="s",
        tools=[AgentTool("crm", crm), AgentTool("flaky", flaky)],
        memory_k=0,
        tool_retry=RetryPolicy(attempts=3, backoff=0.01),
    )
    rt = _open(settings, _tool_answers(script))
    try:
        run = rt.run(agent, "t-1", owner="o", task="x")
        transcript = rt.context.events("t-1")
    finally:
        rt.close()
    assert run.status is RunStatus.COMPLETED
    assert '{"error": "CRM API returned 503", "error_type": "RuntimeError"}' in run.output
    assert '"score": 7' in run.output
    assert len(keys) == 3
    assert len(set(keys)) == 1
    errors = [e for e in transcript if e.kind == "tool_result" and e.message.is_error]
    assert [e.message.name for e in errors] == ["crm"]


def test_on_error_fail_fails_the_run_and_retry_calls_the_tool_again(settings: Settings) -> None:
    """A tool that must not be papered over fails the run; rt.retry continues from the last step."""
    state = {"up": False}

    def charge(key: str, amount: int) -> dict[str, Any]:
        if not state["up"]:
            raise RuntimeError("payment gateway is down")
        return {"charged": amount}

    def script(results: list[str]) -> ModelResponse:
        if not results:
            return ModelResponse(tool_calls=(ToolCall("c1", "charge", {"amount": 5}),))
        return ModelResponse(content=results[0])

    agent = Agent("pay", system="s", tools=[AgentTool("charge", charge, on_error="fail")], memory_k=0)
    rt = _open(settings, _tool_answers(script))
    try:
        run = rt.run(agent, "pay-1", owner="o", task="x")
        assert run.status is RunStatus.FAILED
        assert "payment gateway is down" in (run.error or "")
        done = rt.run(Agent("ok", "s", [], memory_k=0), "ok-1", owner="o", task="x")
        with pytest.raises(InvalidInputError, match="only a failed run"):
            rt.retry(done.run_id)
        state["up"] = True
        run = rt.retry("pay-1")
        ledger = rt.engine.store.tool_calls("pay-1")
    finally:
        rt.close()
    assert run.status is RunStatus.COMPLETED
    assert run.output == '{"charged": 5}'
    assert [c.status for c in ledger] == ["completed"]


def test_on_error_ask_waits_for_a_person_to_call_it_again(settings: Settings) -> None:
    """With on_error='ask' a failed call waits for a person; approving calls it again."""
    attempts: list[str] = []

    def export(key: str, lead: str) -> dict[str, Any]:
        attempts.append(key)
        if len(attempts) == 1:
            raise RuntimeError("export API returned 503")
        return {"exported": lead}

    def script(results: list[str]) -> ModelResponse:
        if len(results) < 2:
            return ModelResponse(
                tool_calls=(ToolCall(f"c{len(results)}", "export", {"lead": f"lead-{len(results)}"}),)
            )
        return ModelResponse(content=" | ".join(results))

    agent = Agent("ex", system="s", tools=[AgentTool("export", export, on_error="ask")], memory_k=0)
    rt = _open(settings, _tool_answers(script))
    try:
        run = rt.run(agent, "ex-1", owner="o", task="x")
        assert run.status is RunStatus.WAITING_FOR_APPROVAL
        [ask] = rt.engine.store.approvals(run_id="ex-1")
        assert "export API returned 503" in ask.reason
        rt.engine.store.decide(ask.approval_id, approve=True, by="ops@example.com")
        run = rt.resume("ex-1")  # called again, it works; the second export works at once
    finally:
        rt.close()
    assert run.status is RunStatus.COMPLETED
    assert run.output == '{"exported": "lead-0"} | {"exported": "lead-1"}'
    assert len(attempts) == 3


def test_a_rejected_retry_hands_the_error_to_the_model(settings: Settings) -> None:
    """Rejecting the call-again approval is not a failure of the run: the model gets the error."""

    def export(key: str, lead: str) -> dict[str, Any]:
        raise RuntimeError("export API returned 503")

    def script(results: list[str]) -> ModelResponse:
        if not results:
            return ModelResponse(tool_calls=(ToolCall("c1", "export", {"lead": "ada"}),))
        return ModelResponse(content=results[0])

    agent = Agent("ex", system="s", tools=[AgentTool("export", export, on_error="ask")], memory_k=0)
    rt = _open(settings, _tool_answers(script))
    try:
        rt.run(agent, "ex-2", owner="o", task="x")
        [ask] = rt.engine.store.approvals(run_id="ex-2")
        rt.engine.store.decide(ask.approval_id, approve=False, by="ops@example.com", comment="later")
        run = rt.resume("ex-2")
    finally:
        rt.close()
    assert run.status is RunStatus.COMPLETED
    assert "export API returned 503" in run.output
    assert "not called again" in run.output


def test_async_tools_are_awaited(settings: Settings) -> None:
    """An async def tool works in run() (on the runtime's loop) and in arun() (on the caller's loop)."""
    loops: list[asyncio.AbstractEventLoop] = []

    async def weather(key: str, city: str) -> dict[str, Any]:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return {"city": city, "weather": "sun"}

    def script(results: list[str]) -> ModelResponse:
        if not results:
            return ModelResponse(tool_calls=(ToolCall("c1", "weather", {"city": "Rome"}),))
        return ModelResponse(content=results[0])

    agent = Agent("w", system="s", tools=[AgentTool("weather", weather)], memory_k=0)
    rt = _open(settings, _tool_answers(script))
    try:
        assert rt.run(agent, "w-1", owner="o", task="x").output == '{"city": "Rome", "weather": "sun"}'

        async def app() -> tuple[str, asyncio.AbstractEventLoop]:
            run = await rt.arun(agent, "w-2", owner="o", task="x")
            return run.output, asyncio.get_running_loop()

        output, caller = asyncio.run(app())
    finally:
        rt.close()
    assert output == '{"city": "Rome", "weather": "sun"}'
    assert loops[1] is caller
    assert loops[0] is not caller
