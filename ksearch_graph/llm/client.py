"""The LLM layer: one OpenAI-compatible chat endpoint, structured answers, retries and token costs.

Everything the search asks a model goes through ``LLMClient``:

- ``structured`` asks for a JSON answer that validates against a pydantic model. It uses the
  endpoint's structured-output feature where there is one, but never trusts it: servers that
  ignore ``response_format`` or tools still answer in text, so the raw answer is parsed here
  (``extract_json``) and, when it does not validate, the model is shown its errors and asked
  again a bounded number of times.
- ``text`` is a plain completion (the coder's answer, from which ``extract_code`` takes files).
- Every HTTP call is retried with capped exponential backoff on transient failures; when the
  endpoint stays down, or is misconfigured, ``EndpointUnavailable`` says so plainly, so that
  the graph can pause the run instead of burning iterations on errors.
- Every call, repairs included, is counted per role in a ``TokenLedger`` that checkpoints as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import openai
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError

from ksearch_graph.config import LLMSettings
from ksearch_graph.llm.answers import extract_json

# Exponential backoff never waits longer than this between two attempts.
_BACKOFF_CAP_S = 60.0
# While a call is in flight, a heartbeat line goes to this logger this often (the CLI prints it).
HEARTBEAT_LOG = logging.getLogger("ksearch_graph.llm.client.heartbeat")
HEARTBEAT_S = float(os.environ.get("KSEARCH_HEARTBEAT_S", "30"))


class LLMConfigError(ValueError):
    """The settings cannot produce a working client (e.g. no API key and no base_url)."""


class EndpointUnavailable(RuntimeError):
    """The endpoint could not answer: down after all retries, or refused the request as configured."""


class StructuredOutputError(ValueError):
    """The model did not produce a valid structured answer, even after the repair rounds."""

    def __init__(self, errors: list[str], raw: str) -> None:
        super().__init__("structured answer still invalid after repairs:\n" + "\n".join(errors))
        self.errors = errors
        self.raw = raw


def make_chat_model(settings: LLMSettings) -> ChatOpenAI:
    if settings.local_model and not settings.base_url:
        raise LLMConfigError(f"the local model {settings.local_model!r} is served only while a run drives it "
                             "(ksearch run/resume start its server)")
    api_key = os.environ.get(settings.api_key_env)
    if settings.local_model or not api_key:
        if not settings.base_url:
            raise LLMConfigError(
                f"no API key: set the environment variable {settings.api_key_env}, "
                "or give a base_url for a local server that needs none"
            )
        api_key = "not-needed"  # local servers (vLLM, SGLang, llama.cpp) accept any key; ours gets no real one
    return ChatOpenAI(
        model=settings.model,
        base_url=settings.base_url,
        api_key=api_key,
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        timeout=settings.timeout_s,
        max_retries=0,  # LLMClient retries itself, so that it can classify and report failures
        # Local OpenAI-compatible servers implement Chat Completions, not the Responses API that
        # langchain-openai switches to for some model names and features.
        use_responses_api=False,
    )


class TokenLedger:
    """Token and cost totals per role; safe to share between threads, checkpointed as JSON."""

    _FIELDS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "calls", "cost_usd")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[str, dict[str, float]] = {}

    def add(self, role: str, usage: dict | None, settings: LLMSettings) -> None:
        """Count one call; ``usage`` is an AIMessage.usage_metadata (input/output_tokens, and the cached input
        tokens in input_token_details.cache_read)."""
        prompt = int((usage or {}).get("input_tokens", 0))
        cached = cached_tokens(usage)
        completion = int((usage or {}).get("output_tokens", 0))
        cached_price = settings.price_cached_prompt_per_mtok
        if cached_price is None:
            cached_price = settings.price_prompt_per_mtok
        cost = ((prompt - cached) * settings.price_prompt_per_mtok + cached * cached_price
                + completion * settings.price_completion_per_mtok) / 1e6
        with self._lock:
            entry = self._roles.setdefault(role, {field: 0 for field in self._FIELDS})
            entry["prompt_tokens"] += prompt
            entry["cached_prompt_tokens"] += cached
            entry["completion_tokens"] += completion
            entry["calls"] += 1
            entry["cost_usd"] += cost

    def totals(self) -> dict[str, float]:
        """Sums over all roles."""
        with self._lock:
            return {f: sum(entry[f] for entry in self._roles.values()) for f in self._FIELDS}

    def to_dict(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {role: dict(entry) for role, entry in self._roles.items()}

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, float]]) -> TokenLedger:
        ledger = cls()
        ledger._roles = {role: {f: entry.get(f, 0) for f in cls._FIELDS} for role, entry in data.items()}
        return ledger


_ROLES = {"human": "user", "ai": "assistant"}  # langchain's message types, as chat APIs name them


def cached_tokens(usage: dict | None) -> int:
    """Input tokens served from the provider's prompt cache, as langchain reports them (never above the input)."""
    details = (usage or {}).get("input_token_details") or {}
    return min(int(details.get("cache_read") or 0), int((usage or {}).get("input_tokens", 0)))


class LLMClient:
    def __init__(
        self,
        settings: LLMSettings,
        role: str,
        ledger: TokenLedger,
        chat_model: BaseChatModel | None = None,
    ) -> None:
        self.settings = settings
        self.role = role
        self.ledger = ledger
        self.chat_model = chat_model if chat_model is not None else make_chat_model(settings)
        # Every request this client made and its raw answer, in order (the run directory records them).
        self.transcript: list[dict] = []

    # ---- public ---------------------------------------------------------------------------
    def text(self, messages: list[BaseMessage]) -> tuple[str, dict]:
        """Plain completion: (answer text, info with prompt_tokens / completion_tokens)."""
        message = self._call(self.chat_model, messages)
        info = {"prompt_tokens": 0, "completion_tokens": 0}
        self._count(message.usage_metadata, info)
        self._record(messages, message.text, message.usage_metadata)
        return message.text, info

    def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, dict]:
        """Ask for an answer validating against ``schema``; returns (object, info).

        info: prompt_tokens / completion_tokens over all calls, ``raw`` (the last answer's text)
        and ``repairs`` (how many times the model was asked to fix its answer).
        """
        runnable = self._structured_runnable(schema)
        conversation = messages
        info: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "raw": "", "repairs": 0}
        while True:
            attempt = self._attempt(runnable, conversation, schema, info)
            info["raw"] = attempt.raw
            if attempt.value is not None:
                return attempt.value, info
            if info["repairs"] >= self.settings.max_repairs:
                raise StructuredOutputError(attempt.errors, attempt.raw)
            info["repairs"] += 1
            # Only the latest answer and its errors: earlier rounds add nothing the model needs, and
            # would grow the prompt past a small model's context (see llm_agents.PromptBudget).
            conversation = list(messages) + [
                AIMessage(content=attempt.raw),
                HumanMessage(content=_repair_request(attempt.errors)),
            ]

    # ---- structured output ------------------------------------------------------------------
    def _structured_runnable(self, schema: type[BaseModel]) -> Runnable | None:
        """The model bound to the endpoint's structured-output feature; None: ask in plain text."""
        method = self.settings.structured_method
        if method == "raw":
            return None
        target: Any = schema
        if method == "json_schema":
            # Given the pydantic class, ChatOpenAI lets the openai SDK validate inside the HTTP
            # call; an answer that does not fit then raises there, losing the raw text and the
            # token usage. A plain JSON-schema dict leaves validation (and repair) to us.
            json_schema = schema.model_json_schema()
            if self.settings.small_model_schema:
                json_schema = small_model_schema(json_schema)
            target = {"name": schema.__name__, "schema": json_schema}
        try:
            return self.chat_model.with_structured_output(target, method=method, include_raw=True)
        except NotImplementedError:
            return None  # a chat model without tool support (e.g. a scripted fake): plain text

    def _attempt(
        self,
        runnable: Runnable | None,
        conversation: list[BaseMessage],
        schema: type[BaseModel],
        info: dict[str, Any],
    ) -> _Attempt:
        try:
            out = self._call(self.chat_model if runnable is None else runnable, conversation)
        except openai.LengthFinishReasonError as exc:
            # With response_format the SDK raises instead of returning a cut-off answer. Such an
            # answer cannot validate, so it becomes a repair round asking for a shorter one.
            usage = exc.completion.usage
            counted = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens} if usage else None
            self._count(counted, info)
            limit = self.settings.max_tokens
            raw = exc.completion.choices[0].message.content or ""
            self._record(conversation, raw, counted)
            return _Attempt(raw, [f"the answer was cut off at the token limit ({limit}); answer more concisely"])
        # Only the raw message is used, never langchain's "parsed": its JSON parsers accept a
        # truncated answer (they close open strings and brackets), which could then validate
        # with defaults. One strict parser also treats all four methods alike.
        message = out if runnable is None else out["raw"]
        self._count(message.usage_metadata, info)
        raw = _answer_text(message)
        self._record(conversation, raw, message.usage_metadata)
        try:
            return _Attempt(raw, [], schema.model_validate(extract_json(raw)))
        except ValidationError as exc:
            return _Attempt(raw, _validation_errors(exc))
        except ValueError as exc:  # extract_json found no valid JSON
            return _Attempt(raw, [str(exc)])

    # ---- plumbing -------------------------------------------------------------------------
    def _call(self, runnable: Runnable, messages: list[BaseMessage]) -> Any:
        """``runnable.invoke`` with retries on transient API errors."""
        s = self.settings
        for attempt in range(s.max_retries + 1):
            try:
                with _Heartbeat(self.role, s) as beat:
                    return runnable.invoke(messages, config={"callbacks": [beat]})
            except openai.APIError as exc:
                if not _is_transient(exc):
                    raise EndpointUnavailable(
                        f"LLM endpoint {s.base_url or 'api.openai.com'} (model {s.model!r}) rejected the "
                        f"request: {_describe(exc)}. This is a configuration problem (model name, API key "
                        f"in ${s.api_key_env}, base_url or request options); the run is paused, fix the "
                        "configuration and resume."
                    ) from exc
                last = exc
            if attempt < s.max_retries:
                delay = min(s.backoff_s * 2**attempt, _BACKOFF_CAP_S)
                time.sleep(delay * random.uniform(0.5, 1.0))  # jitter: parallel workers spread out
        raise EndpointUnavailable(
            f"LLM endpoint {s.base_url or 'api.openai.com'} (model {s.model!r}) unavailable after "
            f"{s.max_retries + 1} attempts; last error: {_describe(last)}"
        ) from last

    def _count(self, usage: dict | None, info: dict) -> None:
        self.ledger.add(self.role, usage, self.settings)
        info["prompt_tokens"] += (usage or {}).get("input_tokens", 0)
        info["completion_tokens"] += (usage or {}).get("output_tokens", 0)

    def _record(self, messages: list[BaseMessage], answer: str, usage: dict | None) -> None:
        self.transcript.append({
            "messages": [{"role": _ROLES.get(m.type, m.type), "content": str(m.content)} for m in messages],
            "answer": answer,
            "prompt_tokens": int((usage or {}).get("input_tokens", 0)),
            "cached_prompt_tokens": cached_tokens(usage),
            "completion_tokens": int((usage or {}).get("output_tokens", 0)),
        })


class _Heartbeat(BaseCallbackHandler):
    """Logs "still waiting" every HEARTBEAT_S seconds of one call: the role, the time so far, and the tokens
    received so far when the model streams (otherwise the time alone)."""

    def __init__(self, role: str, settings: LLMSettings) -> None:
        self.role, self.settings = role, settings
        self.tokens = 0
        self._done = threading.Event()

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens += 1

    def __enter__(self) -> _Heartbeat:
        self._started = time.monotonic()
        threading.Thread(target=self._beat, daemon=True, name=f"heartbeat-{self.role}").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _beat(self) -> None:
        while not self._done.wait(HEARTBEAT_S):
            elapsed = time.monotonic() - self._started
            limit = f", answers up to {self.settings.max_tokens} tokens" if self.settings.max_tokens else ""
            tokens = f"{self.tokens} tokens so far" if self.tokens else "no token count (the answer is not streamed)"
            HEARTBEAT_LOG.info(f"[llm] {self.role}: waiting for {self.settings.model}, {elapsed:.0f} s, {tokens}{limit}")


@dataclass
class _Attempt:
    raw: str
    errors: list[str]
    value: BaseModel | None = None


_SMALL_MODEL_STRING_CHARS = 400
_SMALL_MODEL_ITEMS = 4
_SMALL_MODEL_FACTORS = [0.5, 0.8, 0.9, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 5.0, 10.0]


def small_model_schema(schema: Any) -> Any:
    """A copy of a JSON schema that a small model cannot leave while the server enforces it.

    Every string is capped at 400 characters (uncapped, a 0.5B model fills a 4000-character field
    with repetition), and a number bounded to a range of at most 10 (a 0..1 value, a 0..10 rating)
    becomes an enum of 11 steps: llama.cpp's grammars enforce enums but not a number's bounds, and a
    small model otherwise writes 7 for a 0..1 value in every repair round; a positive factor (above 0, up to a
    wide maximum) becomes an enum of factors from 0.5 to 10. Lists hold at most 4 items
    and free-form objects (an action's params) stay empty, so the longest answer the schema allows
    (4 actions of about 300 tokens) fits the answer limit instead of being cut off mid-JSON.
    """
    if isinstance(schema, list):
        return [small_model_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: small_model_schema(value) for key, value in schema.items()}
    if "enum" in out or "const" in out:
        return out
    if out.get("type") == "string":
        out["maxLength"] = min(out.get("maxLength", _SMALL_MODEL_STRING_CHARS), _SMALL_MODEL_STRING_CHARS)
    elif out.get("type") == "array":
        out["maxItems"] = max(out.get("minItems", 0), min(out.get("maxItems", _SMALL_MODEL_ITEMS), _SMALL_MODEL_ITEMS))
    elif out.get("type") == "object" and "properties" not in out:
        out.update(properties={}, additionalProperties=False)
    elif out.get("type") == "number" and "minimum" in out and "maximum" in out:
        low, high = out.pop("minimum"), out.pop("maximum")
        if 0 < high - low <= 10:
            out["enum"] = [round(low + (high - low) * i / 10, 6) for i in range(11)]
        else:
            out["minimum"], out["maximum"] = low, high
    elif out.get("type") == "number" and out.get("exclusiveMinimum") == 0 and "maximum" in out:
        # A positive factor (a predicted speed-up): unenforced, a small model writes 0.
        high = out.pop("maximum")
        out.pop("exclusiveMinimum")
        out["enum"] = [f for f in _SMALL_MODEL_FACTORS if f <= high]
    return out


def _is_transient(exc: openai.APIError) -> bool:
    # APITimeoutError is an APIConnectionError; InternalServerError covers every 5xx status.
    return isinstance(exc, (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError))


def _describe(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    text = f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {exc.message}"
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    # A connection error's message is only "Connection error."; the network-level cause says which.
    return text if isinstance(root, openai.APIError) else f"{text} ({type(root).__name__}: {root})"


def _answer_text(message: AIMessage) -> str:
    """The text holding the JSON: a tool call's arguments (function calling) or the content."""
    if message.tool_calls:
        return json.dumps(message.tool_calls[0]["args"])
    if message.invalid_tool_calls:  # arguments that are not JSON: show them to the repair round
        return message.invalid_tool_calls[0].get("args") or ""
    return message.text


def _validation_errors(exc: ValidationError) -> list[str]:
    return [
        f"{'.'.join(str(part) for part in error['loc']) or '(root)'}: {error['msg']}"
        for error in exc.errors()
    ]


def _repair_request(errors: list[str]) -> str:
    return (
        "Your previous answer could not be used:\n"
        + "\n".join(f"- {error}" for error in errors)
        + "\nAnswer again with only the corrected JSON object, following the requested schema."
    )


# ---- JSON and code extraction -----------------------------------------------------------------


