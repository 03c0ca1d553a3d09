"""The served wrappers' guards: the admission limit and its bounded queue, and the question's length bound."""

from __future__ import annotations

import asyncio

import pytest

from haystack_fusion.serving.hayhooks import AdmissionLimit, ServerBusyError, ServingLimits


class TestServingLimits:
    def test_defaults_per_llm(self):
        local = ServingLimits.from_env("local", {})
        assert (local.max_requests, local.queue_timeout) == (1, 300.0)  # one question at a time; the next waits
        hosted = ServingLimits.from_env("openai", {})
        assert (hosted.max_requests, hosted.queue_timeout) == (32, 30.0)
        limits = ServingLimits.from_env("ollama", {})
        assert (limits.max_requests, limits.max_waiting, limits.queue_timeout, limits.max_question_chars) == (
            4,
            64,
            120.0,
            2000,
        )

    def test_environment_overrides(self):
        env = {
            "HAYSTACK_FUSION_MAX_REQUESTS": "3",
            "HAYSTACK_FUSION_MAX_WAITING": "0",
            "HAYSTACK_FUSION_QUEUE_TIMEOUT": "2.5",
            "HAYSTACK_FUSION_MAX_QUESTION_CHARS": "10",
        }
        assert ServingLimits.from_env("local", env) == ServingLimits(3, 0, 2.5, 10)

    @pytest.mark.parametrize(
        ("variable", "value", "match"),
        [
            ("HAYSTACK_FUSION_MAX_REQUESTS", "0", "HAYSTACK_FUSION_MAX_REQUESTS: `max_requests` must be at least 1"),
            ("HAYSTACK_FUSION_QUEUE_TIMEOUT", "soon", "HAYSTACK_FUSION_QUEUE_TIMEOUT must be a number"),
            ("HAYSTACK_FUSION_MAX_WAITING", "-1", "`max_waiting` must be at least 0"),
        ],
    )
    def test_bad_values_name_the_variable(self, variable, value, match):
        with pytest.raises(ValueError, match=match):
            ServingLimits.from_env("openai", {variable: value})

    def test_question_bound_gives_lengths_not_the_question(self):
        limits = ServingLimits(max_question_chars=5)
        limits.check_question("  12345  ")
        with pytest.raises(ValueError, match="has 6 characters; this server answers questions of at most 5") as error:
            limits.check_question("secret")
        assert "secret" not in str(error.value)


async def _hold(limit: AdmissionLimit, seconds: float, log: list[str], name: str) -> None:
    try:
        async with limit.slot():
            log.append(f"{name} in")
            await asyncio.sleep(seconds)
    except ServerBusyError as error:
        log.append(f"{name} refused: {error}")
        return
    log.append(f"{name} out")


class TestAdmissionLimit:
    def test_runs_at_most_max_requests_and_queues_in_order(self):
        limit = AdmissionLimit(max_requests=2, max_waiting=10, queue_timeout=5)
        log: list[str] = []
        peak = 0

        async def main() -> None:
            nonlocal peak
            tasks = [asyncio.create_task(_hold(limit, 0.05, log, str(i))) for i in range(6)]
            while not all(task.done() for task in tasks):
                peak = max(peak, limit.running)
                await asyncio.sleep(0.005)

        asyncio.run(main())
        assert peak == 2
        assert [entry for entry in log if entry.endswith(" in")] == [f"{i} in" for i in range(6)]
        assert (limit.running, limit.waiting) == (0, 0)

    def test_a_full_queue_refuses_at_once(self):
        limit = AdmissionLimit(max_requests=1, max_waiting=1, queue_timeout=5)
        log: list[str] = []

        async def main() -> float:
            loop = asyncio.get_running_loop()
            first = asyncio.create_task(_hold(limit, 0.3, log, "a"))
            second = asyncio.create_task(_hold(limit, 0.0, log, "b"))
            await asyncio.sleep(0.01)
            start = loop.time()
            with pytest.raises(ServerBusyError, match="1 requests are running and 1 waiting") as error:
                await limit.slot().__aenter__()
            assert error.value.retry_after == 5
            refused_after = loop.time() - start
            await asyncio.gather(first, second)
            return refused_after

        assert asyncio.run(main()) < 0.05
        assert log == ["a in", "a out", "b in", "b out"]

    def test_the_wait_is_bounded_by_the_queue_timeout(self):
        limit = AdmissionLimit(max_requests=1, max_waiting=5, queue_timeout=0.1)
        log: list[str] = []

        async def main() -> None:
            await asyncio.gather(_hold(limit, 0.5, log, "a"), _hold(limit, 0.0, log, "b"))

        asyncio.run(main())
        assert log[0] == "a in"
        assert log[1].startswith("b refused: The server is busy: no request slot came free within 0.1 s")
        assert (limit.running, limit.waiting) == (0, 0)

    def test_a_cancelled_waiter_leaks_no_slot(self):
        limit = AdmissionLimit(max_requests=1, max_waiting=5, queue_timeout=5)

        async def main() -> None:
            async with limit.slot():
                waiter = asyncio.create_task(limit.slot().__aenter__())
                await asyncio.sleep(0.01)
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)
            async with asyncio.timeout(1), limit.slot():
                pass

        asyncio.run(main())
        assert (limit.running, limit.waiting) == (0, 0)
