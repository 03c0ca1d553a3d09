"""
The circuit breaker of an LLM backend (`haystack_fusion.breaker`) and `CallLimitedChatGenerator` going through it:
closed -> open after N failures in a row, calls failing at once while open, one probe after the cool-down, closed
by its success and opened again by its failure; from threads and from event loops.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, ClassVar

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.breaker import CircuitBreaker, CircuitOpenError, counts_as_backend_failure
from haystack_fusion.llm import CallLimitedChatGenerator, backend_unusable, run_chat_calls, run_chat_calls_async
from haystack_fusion.settings import BreakerSettings


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ServerError(Exception):
    """An HTTP error as the openai client raises it: a status code."""

    def __init__(self, status_code: int = 500) -> None:
        super().__init__(f"Error code: {status_code}")
        self.status_code = status_code


def fail(breaker: CircuitBreaker, error: Exception | None = None) -> None:
    with pytest.raises(type(error or ServerError())), breaker.calling():
        raise error or ServerError()


def succeed(breaker: CircuitBreaker) -> None:
    with breaker.calling():
        pass


class TestStates:
    def test_closed_until_the_threshold_of_failures_in_a_row(self):
        breaker = CircuitBreaker("b", failure_threshold=3, cooldown=10, clock=Clock())
        fail(breaker)
        fail(breaker)
        succeed(breaker)  # the run starts afresh
        fail(breaker)
        fail(breaker)
        assert breaker.state == "closed"
        fail(breaker)
        assert breaker.state == "open"

    def test_open_fails_at_once_without_running_the_call(self):
        clock = Clock()
        breaker = CircuitBreaker("openai http://x/v1", failure_threshold=2, cooldown=10, clock=clock)
        fail(breaker)
        fail(breaker, ServerError(502))
        clock.now += 4
        ran = []
        with pytest.raises(CircuitOpenError) as refused, breaker.calling():
            ran.append(1)
        assert ran == []
        assert refused.value.retry_after == pytest.approx(6)
        assert (refused.value.failures, refused.value.status, refused.value.backend) == (2, 502, "openai http://x/v1")
        assert breaker.retry_after() == pytest.approx(6)
        assert "failed 2 calls in a row (the last: ServerError (HTTP 502))" in str(refused.value)

    def test_one_probe_after_the_cooldown_and_its_success_closes(self):
        clock = Clock()
        breaker = CircuitBreaker("b", failure_threshold=1, cooldown=10, clock=clock)
        fail(breaker)
        clock.now += 10
        assert breaker.state == "half_open"
        assert breaker.retry_after() == 0
        probe = breaker.admit()
        assert probe is True
        for _ in range(3):  # the calls arriving during the probe fail at once
            with pytest.raises(CircuitOpenError):
                breaker.admit()
        assert breaker.retry_after() == 10  # until the probe's outcome
        breaker.succeeded(probe)
        assert breaker.state == "closed"
        assert breaker.admit() is False

    def test_the_probes_failure_opens_it_for_another_cooldown(self):
        clock = Clock()
        breaker = CircuitBreaker("b", failure_threshold=1, cooldown=10, clock=clock)
        fail(breaker)
        clock.now += 11
        fail(breaker)  # the probe
        assert breaker.state == "open"
        assert breaker.retry_after() == pytest.approx(10)
        clock.now += 9.5
        with pytest.raises(CircuitOpenError):
            breaker.admit()
        clock.now += 0.5
        succeed(breaker)
        assert breaker.state == "closed"

    def test_a_cancelled_probe_hands_its_turn_to_the_next_call(self):
        clock = Clock()
        breaker = CircuitBreaker("b", failure_threshold=1, cooldown=10, clock=clock)
        fail(breaker)
        clock.now += 10
        with pytest.raises(asyncio.CancelledError), breaker.calling():
            raise asyncio.CancelledError
        assert breaker.admit() is True

    def test_calls_under_way_when_it_opened_change_nothing(self):
        clock = Clock()
        breaker = CircuitBreaker("b", failure_threshold=2, cooldown=10, clock=clock)
        late_success, late_failure = breaker.admit(), breaker.admit()
        fail(breaker)
        fail(breaker)
        breaker.succeeded(late_success)
        breaker.failed(late_failure, ServerError())
        assert breaker.state == "open"
        assert breaker.retry_after() == pytest.approx(10)  # not pushed back by the late failure

    @pytest.mark.parametrize(("status", "counts"), [(400, False), (404, False), (401, True), (429, True), (503, True)])
    def test_a_4xx_refusing_only_this_request_does_not_count(self, status, counts):
        assert counts_as_backend_failure(ServerError(status)) is counts
        breaker = CircuitBreaker("b", failure_threshold=1, cooldown=10, clock=Clock())
        fail(breaker, ServerError(status))
        assert breaker.state == ("open" if counts else "closed")

    def test_its_own_refusal_is_not_a_failure_and_says_the_backend_is_unusable(self):
        refusal = CircuitOpenError("b", retry_after=3, failures=5)
        assert not counts_as_backend_failure(refusal)
        assert backend_unusable(refusal)
        wrapped = RuntimeError("the component failed")
        wrapped.__cause__ = refusal
        assert backend_unusable(wrapped)

    @pytest.mark.parametrize(("threshold", "cooldown"), [(0, 1.0), (True, 1.0), (2.5, 1.0), (1, 0), (1, -1.0)])
    def test_settings_out_of_range_are_refused(self, threshold, cooldown):
        with pytest.raises(ValueError, match=r"failure_threshold|cooldown"):
            CircuitBreaker("b", failure_threshold=threshold, cooldown=cooldown)

    def test_shared_by_name_and_settings(self):
        one = CircuitBreaker.shared("test-shared", failure_threshold=2, cooldown=5)
        assert CircuitBreaker.shared("test-shared", failure_threshold=2, cooldown=5.0) is one
        assert CircuitBreaker.shared("test-shared", failure_threshold=3, cooldown=5) is not one
        assert one.to_dict() == {"name": "test-shared", "failure_threshold": 2, "cooldown": 5.0}


class TestConcurrency:
    def test_threads_open_it_once_and_let_exactly_one_probe_through(self):
        clock = Clock()
        breaker = CircuitBreaker("b", failure_threshold=5, cooldown=10, clock=clock)
        start = threading.Barrier(16)
        outcomes: list[str] = []
        lock = threading.Lock()

        def call() -> None:
            start.wait()
            try:
                with breaker.calling():
                    time.sleep(0.01)
                    raise ServerError()
            except CircuitOpenError:
                result = "refused"
            except ServerError:
                result = "failed"
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=call) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(outcomes) == 16
        assert breaker.state == "open"

        clock.now += 10
        probes = []
        gate = threading.Event()

        def after_cooldown() -> None:
            start.wait()
            try:
                with breaker.calling():
                    with lock:
                        probes.append(1)
                    gate.wait(5)
            except CircuitOpenError:
                pass

        start = threading.Barrier(16)
        threads = [threading.Thread(target=after_cooldown) for _ in range(16)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 5
        while not probes and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        gate.set()
        for thread in threads:
            thread.join(10)
        assert probes == [1]
        assert breaker.state == "closed"

    def test_coroutines_on_one_loop(self):
        clock = Clock()
        breaker = CircuitBreaker("b", failure_threshold=3, cooldown=10, clock=clock)
        sent: list[int] = []

        async def call(i: int, *, ok: bool, pause: float = 0.01) -> str:
            try:
                with breaker.calling():
                    sent.append(i)
                    await asyncio.sleep(pause)
                    if not ok:
                        raise ServerError()
                    return "answered"
            except CircuitOpenError:
                return "refused"
            except ServerError:
                return "failed"

        async def scenario() -> tuple[list[str], list[str], list[str]]:
            first = await asyncio.gather(*(call(i, ok=False) for i in range(3)))
            refused = await asyncio.gather(*(call(i, ok=True) for i in range(3, 6)))
            clock.now += 10
            probe_round = await asyncio.gather(call(6, ok=True, pause=0.05), *(call(i, ok=True) for i in range(7, 10)))
            return first, refused, probe_round

        first, refused, probe_round = asyncio.run(scenario())
        assert first == ["failed"] * 3
        assert refused == ["refused"] * 3
        assert probe_round == ["answered", "refused", "refused", "refused"]
        assert sent == [0, 1, 2, 6]
        assert breaker.state == "closed"


def failing_llm(breaker: CircuitBreaker, calls: list[int]) -> CallLimitedChatGenerator:
    def reply(_messages: list[ChatMessage]) -> str:
        calls.append(1)
        raise ServerError(500)

    return CallLimitedChatGenerator(chat_generator=MockChatGenerator(response_fn=reply), breaker=breaker)


class TestCallLimitedChatGenerator:
    PROMPT: ClassVar[list[ChatMessage]] = [ChatMessage.from_user("Capital of France?")]

    def test_an_open_breaker_fails_the_calls_at_once_unsent(self):
        calls: list[int] = []
        llm = failing_llm(CircuitBreaker("b", failure_threshold=2, cooldown=60), calls)
        result = run_chat_calls(llm, [self.PROMPT] * 2, max_concurrency=1)
        assert result.usage["failed_calls"] == 2
        result = run_chat_calls(llm, [self.PROMPT] * 3)
        assert len(calls) == 2  # never sent
        assert result.usage["failed_calls"] == 3
        assert {(failure.kind, failure.error_type, failure.status) for failure in result.failures} == {
            ("circuit_open", "CircuitOpenError", 500)  # the status of the last failed call
        }
        assert all(failure.message.startswith("the LLM server failed 2 calls") for failure in result.failures)

    def test_async_calls_too(self):
        calls: list[int] = []
        llm = failing_llm(CircuitBreaker("b", failure_threshold=2, cooldown=60), calls)

        async def run() -> Any:
            await run_chat_calls_async(llm, [self.PROMPT] * 2, max_concurrency=1)
            return await run_chat_calls_async(llm, [self.PROMPT] * 4)

        result = asyncio.run(run())
        assert len(calls) == 2
        assert [failure.kind for failure in result.failures] == ["circuit_open"] * 4

    def test_serialized_with_its_breakers_settings_and_shared_when_loaded(self):
        breaker = CircuitBreaker.shared("test-roundtrip", failure_threshold=4, cooldown=12)
        llm = CallLimitedChatGenerator(chat_generator=MockChatGenerator(), breaker=breaker)
        data = llm.to_dict()
        expected = {"name": "test-roundtrip", "failure_threshold": 4, "cooldown": 12.0}
        assert data["init_parameters"]["breaker"] == expected
        loaded = CallLimitedChatGenerator.from_dict(data)
        assert loaded.breaker is breaker
        plain = CallLimitedChatGenerator(chat_generator=MockChatGenerator())
        assert CallLimitedChatGenerator.from_dict(plain.to_dict()).breaker is None


class TestSettings:
    def test_defaults_and_variables(self):
        assert BreakerSettings.from_env({}) == BreakerSettings(failure_threshold=5, cooldown=30.0)
        settings = BreakerSettings.from_env(
            {"HAYSTACK_FUSION_BREAKER_FAILURES": "3", "HAYSTACK_FUSION_BREAKER_COOLDOWN": "2.5"}
        )
        assert (settings.failure_threshold, settings.cooldown, settings.enabled) == (3, 2.5, True)
        assert not BreakerSettings.from_env({"HAYSTACK_FUSION_BREAKER_FAILURES": "0"}).enabled

    @pytest.mark.parametrize(
        ("variable", "value"),
        [
            ("HAYSTACK_FUSION_BREAKER_FAILURES", "many"),
            ("HAYSTACK_FUSION_BREAKER_FAILURES", "-1"),
            ("HAYSTACK_FUSION_BREAKER_COOLDOWN", "0"),
            ("HAYSTACK_FUSION_BREAKER_COOLDOWN", "soon"),
            ("HAYSTACK_FUSION_BREAKER_COOLDOWN", "inf"),
        ],
    )
    def test_a_bad_value_names_its_variable(self, variable, value):
        with pytest.raises(ValueError, match=f"^{variable}"):
            BreakerSettings.from_env({variable: value})
