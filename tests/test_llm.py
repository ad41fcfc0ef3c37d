"""The LLM layer against a real ChatOpenAI talking to a scripted local server (no internet)."""

from __future__ import annotations

import socket
import time

import openai
import pytest
from fake_openai_server import Reply  # the fake_openai fixture comes from conftest.py
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from ksearch_graph.llm.answers import CodeExtractionError, extract_code, extract_json
from ksearch_graph.llm.client import (
    EndpointUnavailable,
    LLMClient,
    LLMConfigError,
    LLMSettings,
    StructuredOutputError,
    TokenLedger,
    make_chat_model,
)


class Action(BaseModel):
    """The next optimisation step."""

    title: str
    block_size: int = Field(gt=0)
    notes: list[str] = []


GOOD = {"title": "tile the reduction", "block_size": 128, "notes": ["use num_warps=8"]}
ASK = [SystemMessage("You plan GPU kernel optimisations."), HumanMessage("Answer in JSON.")]


def client(server, role="planner", ledger=None, **overrides) -> LLMClient:
    settings = LLMSettings(model=server.model, base_url=server.base_url, backoff_s=0.001, **overrides)
    return LLMClient(settings, role, ledger if ledger is not None else TokenLedger())


# ---- structured output ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode", "raw"])
def test_each_structured_method_parses(fake_openai, method):
    fake_openai.push(Reply.json(GOOD, prompt_tokens=30, completion_tokens=5))
    ledger = TokenLedger()
    action, info = client(fake_openai, ledger=ledger, structured_method=method).structured(ASK, Action)

    assert action == Action(**GOOD)
    assert info == {"prompt_tokens": 30, "completion_tokens": 5, "raw": info["raw"], "repairs": 0}
    assert ledger.to_dict()["planner"]["prompt_tokens"] == 30
    request = fake_openai.requests[0]
    kind = {"json_schema": "json_schema", "json_mode": "json_object"}.get(method)
    assert request.get("response_format", {}).get("type") == kind
    assert ("tools" in request) == (method == "function_calling")
    if method == "json_schema":
        assert request["response_format"]["json_schema"]["schema"]["required"] == ["title", "block_size"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_server_ignoring_structured_output_is_recovered_from_text(fake_openai, method):
    # A server that ignores response_format/tools answers in prose with a fenced JSON block.
    fake_openai.push(Reply.content('Sure, here is the plan:\n```json\n{"title": "t", "block_size": 64}\n```\nDone.'))
    action, info = client(fake_openai, structured_method=method).structured(ASK, Action)
    assert action == Action(title="t", block_size=64)
    assert info["repairs"] == 0


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_invalid_answer_is_repaired_with_the_validation_errors(fake_openai, method):
    fake_openai.push(Reply.json({"title": "t", "block_size": -1}), Reply.json({"title": "t", "block_size": 32}))
    ledger = TokenLedger()
    action, info = client(fake_openai, ledger=ledger, structured_method=method).structured(ASK, Action)

    assert action.block_size == 32 and info["repairs"] == 1
    assert info["prompt_tokens"] == 22 and ledger.totals()["calls"] == 2
    second = fake_openai.requests[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": '{"title": "t", "block_size": -1}'}
    assert "block_size: Input should be greater than 0" in second[-1]["content"]


def test_invalid_json_is_repaired(fake_openai):
    fake_openai.push(Reply.content('{"title": "t", "block_size": 8,}'), Reply.json({"title": "t", "block_size": 8}))
    action, info = client(fake_openai, structured_method="raw").structured(ASK, Action)
    assert action.block_size == 8 and info["repairs"] == 1
    assert "not valid JSON" in fake_openai.requests[1]["messages"][-1]["content"]


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_truncated_json_is_not_completed_silently(fake_openai, method):
    # langchain's own JSON parsers would close the string and object and accept this answer.
    fake_openai.push(Reply.content('{"title": "tile", "block_size": 8, "notes": ["a'), Reply.json(GOOD))
    action, info = client(fake_openai, structured_method=method).structured(ASK, Action)
    assert action == Action(**GOOD) and info["repairs"] == 1


def test_repairs_are_bounded(fake_openai):
    fake_openai.push(*[Reply.content("I cannot answer in JSON.")] * 3)
    with pytest.raises(StructuredOutputError) as caught:
        client(fake_openai, max_repairs=2).structured(ASK, Action)
    assert caught.value.errors == ["the answer contains no JSON object"]
    assert caught.value.raw == "I cannot answer in JSON."
    assert len(fake_openai.requests) == 3


def test_cut_off_answer_becomes_a_repair_round(fake_openai):
    # With response_format the openai SDK raises LengthFinishReasonError instead of returning.
    fake_openai.push(Reply.content('{"title": "a very lo', finish_reason="length"), Reply.json(GOOD))
    ledger = TokenLedger()
    action, info = client(fake_openai, ledger=ledger, max_tokens=50).structured(ASK, Action)
    assert action == Action(**GOOD) and info["repairs"] == 1
    assert ledger.totals()["calls"] == 2
    assert "cut off at the token limit (50)" in fake_openai.requests[1]["messages"][-1]["content"]


def test_chat_model_without_tool_support_falls_back_to_text():
    fake = GenericFakeChatModel(messages=iter([AIMessage('{"title": "t", "block_size": 4}')]))
    ledger = TokenLedger()
    action, _ = LLMClient(LLMSettings(model="fake"), "coder", ledger, chat_model=fake).structured(ASK, Action)
    assert action.block_size == 4 and ledger.totals()["calls"] == 1


def test_text_completion_and_ledger_per_role(fake_openai):
    fake_openai.push(Reply.content("hello", prompt_tokens=1000, completion_tokens=500), Reply.json(GOOD))
    ledger = TokenLedger()
    prices = {"price_prompt_per_mtok": 2.0, "price_completion_per_mtok": 8.0}
    text, info = client(fake_openai, role="coder", ledger=ledger, **prices).text(ASK)
    client(fake_openai, role="planner", ledger=ledger, **prices).structured(ASK, Action)

    assert text == "hello" and info == {"prompt_tokens": 1000, "completion_tokens": 500}
    by_role = ledger.to_dict()
    assert by_role["coder"] == {"prompt_tokens": 1000, "cached_prompt_tokens": 0, "completion_tokens": 500,
                                "calls": 1, "cost_usd": 0.006}
    assert by_role["planner"]["calls"] == 1
    assert ledger.totals()["prompt_tokens"] == 1011
    assert TokenLedger.from_dict(by_role).to_dict() == by_role


def test_cached_prompt_tokens_are_priced_as_the_provider_reports_them(fake_openai):
    """OpenAI-style usage.prompt_tokens_details.cached_tokens: those input tokens cost the cached price."""
    fake_openai.push(Reply.content("a", prompt_tokens=1000, completion_tokens=100, cached_tokens=800),
                     Reply.content("b", prompt_tokens=1000, completion_tokens=100, cached_tokens=800),
                     Reply.content("c", prompt_tokens=1000, completion_tokens=100))
    prices = {"price_prompt_per_mtok": 2.0, "price_completion_per_mtok": 8.0}
    discounted, full, uncached = TokenLedger(), TokenLedger(), TokenLedger()
    client(fake_openai, role="coder", ledger=discounted, **prices, price_cached_prompt_per_mtok=0.5).text(ASK)
    client(fake_openai, role="coder", ledger=full, **prices).text(ASK)  # no cached price: the full prompt price
    c = client(fake_openai, role="coder", ledger=uncached, **prices, price_cached_prompt_per_mtok=0.5)
    c.text(ASK)
    assert discounted.to_dict()["coder"]["cached_prompt_tokens"] == 800
    assert discounted.totals()["cost_usd"] == pytest.approx((200 * 2.0 + 800 * 0.5 + 100 * 8.0) / 1e6)
    assert full.totals()["cost_usd"] == pytest.approx((1000 * 2.0 + 100 * 8.0) / 1e6)
    assert uncached.totals()["cached_prompt_tokens"] == 0
    # The request and the raw answer are kept for the run directory.
    assert c.transcript[0]["answer"] == "c" and c.transcript[0]["messages"][-1]["role"] == "user"


# ---- endpoint failures ------------------------------------------------------------------------


def test_transient_errors_are_retried(fake_openai):
    fake_openai.push(Reply.error(500), Reply.error(429, "slow down"), Reply.error(503), Reply.json(GOOD))
    action, _ = client(fake_openai).structured(ASK, Action)
    assert action == Action(**GOOD) and len(fake_openai.requests) == 4


def test_timeout_is_retried(fake_openai):
    fake_openai.push(Reply.hang(5), Reply.content("late but fine"))
    started = time.monotonic()
    text, _ = client(fake_openai, timeout_s=0.3).text(ASK)
    assert text == "late but fine" and time.monotonic() - started < 3


def test_dead_endpoint_raises_after_bounded_retries():
    with socket.socket() as probe:  # a free port nobody listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = LLMSettings(model="m1", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, backoff_s=0.001)
    started = time.monotonic()
    with pytest.raises(EndpointUnavailable) as caught:
        LLMClient(settings, "planner", TokenLedger()).text(ASK)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "'m1'" in message and "after 3 attempts" in message
    assert "Connection refused" in message
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("status", [401, 404])
def test_configuration_errors_are_not_retried(fake_openai, status):
    fake_openai.push(Reply.error(status, "bad key or model"), Reply.json(GOOD))
    with pytest.raises(EndpointUnavailable, match="configuration problem") as caught:
        client(fake_openai).structured(ASK, Action)
    assert f"HTTP {status}" in str(caught.value) and "bad key or model" in str(caught.value)
    assert len(fake_openai.requests) == 1 and fake_openai.remaining == 1


def test_make_chat_model_reads_the_key_at_call_time(monkeypatch):
    remote = LLMSettings(model="m", api_key_env="KS_TEST_KEY")
    local = LLMSettings(model="m", base_url="http://127.0.0.1:1/v1", api_key_env="KS_TEST_KEY")
    monkeypatch.delenv("KS_TEST_KEY", raising=False)
    with pytest.raises(LLMConfigError, match="KS_TEST_KEY"):
        make_chat_model(remote)
    model = make_chat_model(local)
    assert model.openai_api_key.get_secret_value() == "not-needed" and model.max_retries == 0
    monkeypatch.setenv("KS_TEST_KEY", "sk-from-env")
    assert make_chat_model(remote).openai_api_key.get_secret_value() == "sk-from-env"
    assert "sk-from-env" not in remote.model_dump_json()


def test_fake_server_lists_models(fake_openai):
    models = openai.OpenAI(base_url=fake_openai.base_url, api_key="x").models.list()
    assert [m.id for m in models.data] == [fake_openai.model]


# ---- extraction -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        'Here you go: {"a": 1} -- hope it helps',
        'Plan:\n```json\n{"a": 1}\n```',
        'Use {braces} in prose, then {"a": 1}',
    ],
)
def test_extract_json_tolerates_surroundings(text):
    assert extract_json(text) == {"a": 1}


def test_extract_json_keeps_braces_inside_strings():
    assert extract_json('x {"code": "if (a) { b(); }", "n": [1, {"m": 2}]} y') == {
        "code": "if (a) { b(); }",
        "n": [1, {"m": 2}],
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"a": 1,}', "not valid JSON"),
        ('Use {x} here: {"x": {"a": 1},} trailing', "not valid JSON: Expecting property name"),
        ("no json here", "no JSON object"),
        ('{"a": "cut', "never closed"),
    ],
)
def test_extract_json_is_strict(text, error):
    with pytest.raises(ValueError, match=error):
        extract_json(text)


def test_extract_code_python_takes_the_largest_block():
    kernel = "import triton\n\n@triton.jit\ndef k(x_ptr):\n    pass\n"
    answer = f"Idea first.\n```python\n{kernel}```\nUsage:\n```py\nk[(1,)](x)\n```\n```bash\npip install triton\n```"
    assert extract_code(answer, language="triton") == {"kernel.py": kernel}
    assert extract_code(f"```\n{kernel}```", language="pytorch", default_file="solution.py") == {"solution.py": kernel}


def test_extract_code_python_without_code_fails():
    with pytest.raises(CodeExtractionError):
        extract_code("I would tile the loop.", language="triton")
    with pytest.raises(CodeExtractionError):
        extract_code("```bash\nls\n```", language="triton")


def test_extract_code_multi_file_cuda():
    answer = (
        "```cuda title=\"kernel.h\"\n#pragma once\nvoid run();\n```\n"
        "```cpp kernel.cu\n#include \"kernel.h\"\n__global__ void k() {}\n```\n"
        "**main.cpp**\n```cpp\nint main() { run(); }\n```\n"
        "```cpp\n// File: util.cuh\ninline int two() { return 2; }\n```\n"
        "```bash\nnvcc kernel.cu\n```"
    )
    files = extract_code(answer, language="cuda", expected_files=["kernel.h", "kernel.cu", "main.cpp"])
    assert sorted(files) == ["kernel.cu", "kernel.h", "main.cpp", "util.cuh"]
    assert files["kernel.cu"].startswith('#include "kernel.h"')
    assert files["util.cuh"].startswith("// File: util.cuh")


def test_extract_code_cuda_single_unnamed_block_and_missing_files():
    assert extract_code("```cuda\n__global__ void k() {}\n```", language="cuda", expected_files=["kernel.cu"]) == {
        "kernel.cu": "__global__ void k() {}\n"
    }
    with pytest.raises(CodeExtractionError, match="main.cpp"):
        extract_code("```cpp kernel.cu\nx\n```", language="cuda", expected_files=["kernel.cu", "main.cpp"])


@pytest.mark.parametrize("name", ["/etc/passwd.h", "../kernel.cu", "a/../../b.cu"])
def test_extract_code_rejects_unsafe_names(name):
    with pytest.raises(CodeExtractionError, match="unsafe"):
        extract_code(f"```cpp {name}\nint x;\n```", language="cuda")
