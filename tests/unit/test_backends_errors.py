"""`haystack_fusion.backends.errors`: one-line messages for backends that cannot be used, with no secret in them."""

from __future__ import annotations

import httpx
import openai
import pytest
from haystack.core.errors import PipelineRuntimeError

from haystack_fusion.backends import BackendConfig, BackendError, backend_error_message, failed_calls_message, safe_url
from haystack_fusion.backends.errors import (
    QUEUED_TIMEOUT_ADVICE,
    failed_calls_user_message,
    llm_server_name,
    queued_timeout_advice,
    user_error_message,
)
from haystack_fusion.breaker import CircuitBreaker, CircuitOpenError
from haystack_fusion.failures import CallFailure, LLMCallsFailedError

KEY = "sk-unit-test-SECRET-9876"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://elastic:pw@es.example.com:9243/?api_key=x#frag", "https://es.example.com:9243/"),
        ("http://127.0.0.1:9200", "http://127.0.0.1:9200"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("not a url", "not a url"),
    ],
)
def test_safe_url_drops_credentials_and_query(url, expected):
    assert safe_url(url) == expected


def wrapped(error: Exception) -> PipelineRuntimeError:
    """The error as a pipeline raises it: Haystack's PipelineRuntimeError with the generator's error as its cause."""
    try:
        try:
            raise error
        except Exception as inner:
            raise PipelineRuntimeError.from_exception("llm", object, inner) from inner
    except PipelineRuntimeError as outer:
        return outer


def status_error(cls: type[openai.APIStatusError], status: int) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx.Response(status, request=request, json={"error": {"message": f"Incorrect API key {KEY}"}})
    return cls(f"Error code: {status} - Incorrect API key provided: {KEY}", response=response, body=None)


class TestBackendErrorMessage:
    config = BackendConfig(llm="openai", api_base_url="http://user:pw@127.0.0.1:9/v1", timeout=2.5)

    def test_timeout_is_not_taken_for_a_refused_connection(self):
        request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
        message = backend_error_message(wrapped(openai.APITimeoutError(request=request)), self.config)
        assert message == (
            "the OpenAI-compatible server at http://127.0.0.1:9/v1 did not answer within 2.5 s: check the server, or "
            "raise --timeout"
        )

    @pytest.mark.parametrize(
        ("cls", "status"), [(openai.AuthenticationError, 401), (openai.PermissionDeniedError, 403)]
    )
    def test_refused_key_names_the_variable_not_the_key(self, cls, status):
        message = backend_error_message(wrapped(status_error(cls, status)), self.config)
        assert message is not None
        assert f"refused the API key in $OPENAI_API_KEY (HTTP {status})" in message
        assert KEY not in message
        assert "pw" not in message

    def test_other_errors_are_not_backend_errors(self):
        assert backend_error_message(wrapped(ValueError("bad")), self.config) is None
        assert backend_error_message(ConnectionError("not ollama's"), self.config) is None

    def test_backend_error_passes_through(self):
        assert backend_error_message(BackendError("its own line"), self.config) == "its own line"

    def test_elasticsearch_errors(self):
        elasticsearch = pytest.importorskip("elasticsearch")
        from elastic_transport import ApiResponseMeta, HttpHeaders, NodeConfig

        config = BackendConfig(store="elasticsearch", elasticsearch_url="https://u:pw@es:9200", elasticsearch_index="x")
        meta = ApiResponseMeta(401, "1.1", HttpHeaders(), 0.0, NodeConfig("https", "es", 9200))
        error = elasticsearch.AuthenticationException(message="no", meta=meta, body={})
        assert backend_error_message(error, config) == (
            "Elasticsearch at https://es:9200 refused the credentials in $ELASTIC_API_KEY / $ELASTIC_API_KEY_ID "
            "(HTTP 401)"
        )
        error = elasticsearch.NotFoundError(message="index_not_found", meta=meta, body={})
        message = backend_error_message(error, config)
        assert message is not None
        assert message.startswith("Elasticsearch at https://es:9200 has no index 'x'")


class TestFailedCallsMessage:
    def test_known_failure_type_gives_the_same_line(self):
        config = BackendConfig(llm="openai", api_base_url="http://127.0.0.1:9/v1")
        refused = CallFailure("key", "AuthenticationError", "Error code: 401", 401)
        message = failed_calls_message([refused], 3, config)
        assert message == (
            "the OpenAI-compatible server at http://127.0.0.1:9/v1 refused the API key in $OPENAI_API_KEY (HTTP 401): "
            "set $OPENAI_API_KEY to a valid key"
        )
        # a run whose every call failed raised it: the command line's line is the same
        assert backend_error_message(wrapped(LLMCallsFailedError([refused] * 3)), config) == message

    def test_unknown_failures_name_the_url_and_variables(self):
        config = BackendConfig(llm="ollama", ollama_url="http://127.0.0.1:9")
        message = failed_calls_message([CallFailure("failing", "RuntimeError", "odd")], 2, config)
        assert message == (
            "every LLM call failed (2 of 2) on the ollama LLM: check $OLLAMA_HOST (http://127.0.0.1:9); the warnings "
            "above give each call's error"
        )


NAMES_NO_SETTING = ("http", "127.0.0.1", "--", "$", "OPENAI", "HAYSTACK_FUSION", "warnings above")
"""What a chat user's line never holds: a URL, a flag, a variable, a pointer to the log."""


def refusal(last_error: BaseException) -> CircuitOpenError:
    """An open breaker's refusal after `last_error`, as `CircuitBreaker.admit` raises it."""
    breaker = CircuitBreaker("openai http://127.0.0.1:9/v1", failure_threshold=1, cooldown=30)
    breaker.failed(False, last_error)
    with pytest.raises(CircuitOpenError) as refused:
        breaker.admit()
    return refused.value


class TestUserErrorMessage:
    config = TestBackendErrorMessage.config
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

    def test_in_the_users_terms(self):
        cases = {
            openai.APIConnectionError(request=self.request): "The language model server cannot be reached; try again "
            "later",
            openai.APITimeoutError(request=self.request): "The language model server did not answer in time; try again "
            "later",
            status_error(openai.AuthenticationError, 401): "The language model server refused this service's access "
            "(HTTP 401 Unauthorized); its operator has to fix it",
        }
        for error, expected in cases.items():
            message = user_error_message(wrapped(error), self.config)
            assert message == expected
            assert not any(word in message for word in NAMES_NO_SETTING), message
            assert KEY not in message

    def test_an_open_breaker_says_what_failed_and_when_to_try_again(self):
        error = wrapped(refusal(status_error(openai.InternalServerError, 500)))
        message = user_error_message(error, self.config)
        assert message == "The language model server is failing: HTTP 500 Internal Server Error; try again in 30 s"
        assert user_error_message(error, self.config, retry_after=4.2) == (
            "The language model server is failing: HTTP 500 Internal Server Error; try again in 5 s"
        )
        unreachable = refusal(openai.APIConnectionError(request=self.request))
        assert user_error_message(unreachable, self.config) == (
            "The language model server cannot be reached; try again in 30 s"
        )
        assert user_error_message(refusal(RuntimeError("odd")), self.config) == (
            "The language model server is failing; try again in 30 s"
        )
        operator = backend_error_message(error, self.config)
        assert operator is not None
        assert operator.startswith(
            "the LLM server openai http://127.0.0.1:9/v1 failed 1 calls in a row (the last: InternalServerError (HTTP "
            "500)): its circuit breaker fails calls at once for 30 s more, then lets one probe call through; check the "
            "server ($HAYSTACK_FUSION_BREAKER_FAILURES"
        )

    def test_other_errors_are_not_backend_errors(self):
        assert user_error_message(wrapped(ValueError("bad")), self.config) is None

    def test_elasticsearch(self):
        config = BackendConfig(store="elasticsearch")
        assert user_error_message(BackendError("no index"), config) == (
            "The document store holds no passages to search; this service's operator has to fix it"
        )


class TestFailedCallsUserMessage:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

    @pytest.mark.parametrize(
        ("error", "expected"),
        [
            (
                status_error(openai.InternalServerError, 500),
                "The language model server is failing: HTTP 500 Internal Server Error; try again later",
            ),
            (
                openai.APITimeoutError(request=request),
                "The language model server did not answer in time; try again later",
            ),
            (
                openai.APIConnectionError(request=request),
                "The language model server cannot be reached; try again later",
            ),
            (
                refusal(status_error(openai.InternalServerError, 502)),
                "The language model server is failing: HTTP 502 Bad Gateway; try again later",
            ),
            (RuntimeError("odd"), "The language model server is failing; try again later"),
        ],
    )
    def test_from_the_failed_calls(self, error, expected):
        failures = [CallFailure.of(error), CallFailure.of(RuntimeError("later"))]
        message = failed_calls_user_message(failures)
        assert message == expected
        assert not any(word in message for word in NAMES_NO_SETTING), message
        config = TestBackendErrorMessage.config
        assert user_error_message(wrapped(LLMCallsFailedError(failures)), config) == expected

    def test_an_open_breakers_wait(self):
        failures = [CallFailure.of(status_error(openai.InternalServerError, 503))]
        assert failed_calls_user_message(failures, retry_after=29.5) == (
            "The language model server is failing: HTTP 503 Service Unavailable; try again in 30 s"
        )
        assert failed_calls_user_message([]) == "The language model server is failing; try again later"


def test_llm_server_names():
    assert (
        llm_server_name(BackendConfig(llm="openai", api_base_url="http://u:pw@h:8000/v1")) == "openai http://h:8000/v1"
    )
    assert llm_server_name(BackendConfig(llm="openai")) == "openai https://api.openai.com/v1"
    assert llm_server_name(BackendConfig(llm="ollama", ollama_url="http://h:11434")) == "ollama http://h:11434"
    assert llm_server_name(BackendConfig(llm="local")) is None


TIMED_OUT = (CallFailure("timeout", "APITimeoutError", "Request timed out.", component="summarizer", index=1),)


class TestQueuedTimeoutAdvice:
    def test_a_timeout_among_calls_sent_together_names_what_helps(self):
        advice = queued_timeout_advice(TIMED_OUT, calls=8, rounds=3, max_calls_in_flight=None)
        assert advice == QUEUED_TIMEOUT_ADVICE
        assert "--max-calls-in-flight 1" in advice
        assert "--timeout" in advice
        assert queued_timeout_advice(TIMED_OUT, calls=8, rounds=3, max_calls_in_flight=4) == advice

    @pytest.mark.parametrize(
        ("failures", "calls", "rounds", "in_flight"),
        [
            (TIMED_OUT, 8, 3, 1),  # already one at a time
            (TIMED_OUT, 3, 3, None),  # one call per round: nothing waited behind another
            ([CallFailure("failing", "BadRequestError", "...", 400, "summarizer")], 8, 3, None),  # not a timeout
            ([], 8, 3, None),
        ],
    )
    def test_nothing_to_advise(self, failures, calls, rounds, in_flight):
        assert queued_timeout_advice(failures, calls=calls, rounds=rounds, max_calls_in_flight=in_flight) is None
