"""The embedded model's reply cache and batch-aligned prefix cache: faster, and the same greedy replies."""

from __future__ import annotations

import pytest
from haystack.dataclasses import ChatMessage

from haystack_fusion.backends import LOCAL_GENERATION_KWARGS, local_chat_generator
from haystack_fusion.backends.local import _LOADED
from haystack_fusion.prompts import PROMPTS, format_passages, render


def prompts(retriever, questions) -> list[list[ChatMessage]]:
    """Concatenation prompts and single-passage (post-fusion) prompts: shared instructions, different passages."""
    rendered = []
    for question in questions[:2]:
        documents = retriever.run(query=question.question)["documents"]
        rendered.append(render(PROMPTS["figure7"], passages=format_passages(documents), query=question.question))
        for document in documents[:2]:
            rendered.append(render(PROMPTS["figure7"], passages=format_passages([document]), query=question.question))
    return rendered


def test_prefix_cache_gives_the_replies_of_a_fresh_evaluation(retriever, questions, llm):
    fresh = local_chat_generator(prefix_cache=False, reply_cache=False, n_batch=512)
    cached = local_chat_generator(prefix_cache=True, reply_cache=False)
    batch = prompts(retriever, questions)
    expected = [fresh.run(prompt)["replies"][0].text for prompt in batch]
    # in another order too, so each prompt follows another prefix than before
    got = {index: cached.run(batch[index])["replies"][0].text for index in [*range(len(batch))][::-1]}
    assert [got[index] for index in range(len(batch))] == expected


def test_reply_cache_answers_a_repeated_greedy_prompt(retriever, questions, llm):
    first, second = local_chat_generator(), local_chat_generator()  # two generators, one loaded model
    prompt = prompts(retriever, questions)[1]
    for shared in _LOADED.values():
        shared.replies.clear()
    reply = first.run(prompt)["replies"][0]
    again = second.run(prompt)["replies"][0]
    assert again.text == reply.text
    assert again.meta["cached"] is True
    assert "cached" not in reply.meta
    assert again.meta["usage"] == reply.meta["usage"]  # a cached reply still counts the call's tokens
    sampled = first.run(prompt, generation_kwargs={"temperature": 0.7, "seed": 1})["replies"][0]
    assert "cached" not in sampled.meta  # sampling is never cached


def test_logprobs_change_no_reply_and_spell_it(retriever, questions, llm):
    """Token log-probabilities read at each decoding step: the same greedy replies, and their tokens spell them."""
    settings = {**LOCAL_GENERATION_KWARGS, "logprobs": False, "max_tokens": 24}
    plain = local_chat_generator(reply_cache=False, generation_kwargs=settings)
    traced = local_chat_generator(reply_cache=False)
    for prompt in prompts(retriever, questions)[:3]:
        expected = plain.run(prompt)["replies"][0].text
        reply = traced.run(prompt, generation_kwargs={"max_tokens": 24, "top_logprobs": 3})["replies"][0]
        assert reply.text == expected
        content = reply.meta["logprobs"]["content"]
        assert "".join(entry["token"] for entry in content) == reply.text
        assert all(entry["logprob"] <= 0 for entry in content)
        assert all(len(entry["top_logprobs"]) == 3 for entry in content)
        # greedy: the chosen token is the most probable one
        assert all(entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"]) for entry in content)


def test_grammar_constrains_the_reply_and_a_bad_one_is_refused(llm):
    """A GBNF grammar (as text) constrains decoding; one llama.cpp cannot parse is a ValueError, not a crash."""
    generator = local_chat_generator(reply_cache=False)
    prompt = [ChatMessage.from_user("Question: Is the sky green?\n\nChoices: [True, False]. Answer:")]
    grammar = 'root ::= " " ("True" | "False")'
    reply = generator.run(prompt, generation_kwargs={"grammar": grammar})["replies"][0]
    assert reply.text in (" True", " False")
    assert len(reply.meta["logprobs"]["content"]) == reply.meta["usage"]["completion_tokens"]
    with pytest.raises(ValueError, match="not a valid GBNF grammar"):
        generator.run(prompt, generation_kwargs={"grammar": "root ::= ("})


def test_usage_reports_the_reused_prefix_as_cached_tokens(llm):
    cached = local_chat_generator(prefix_cache=True, reply_cache=False)
    fresh = local_chat_generator(prefix_cache=False, reply_cache=False)
    head = "Context: " + " ".join(f"word{i}" for i in range(700)) + "\n"  # > 1024 shared tokens
    settings = {"max_tokens": 2}
    cached.run([ChatMessage.from_user(head + "Question: first?\nAnswer:")], generation_kwargs=settings)
    usage = cached.run([ChatMessage.from_user(head + "Question: second?\nAnswer:")], generation_kwargs=settings)[
        "replies"
    ][0].meta["usage"]
    reused = usage["prompt_tokens_details"]["cached_tokens"]
    assert reused > 0
    assert reused % 512 == 0  # the batch-aligned prefix (`DEFAULT_BATCH_TOKENS`)
    assert reused < usage["prompt_tokens"]
    usage = fresh.run([ChatMessage.from_user(head + "Question: second?\nAnswer:")], generation_kwargs=settings)[
        "replies"
    ][0].meta["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_extra_buffer_types_can_be_turned_off(llm):
    """`use_extra_bufts=False` reaches llama.cpp's model parameters (`pinned.load_llama`), and the model answers."""
    generator = local_chat_generator(reply_cache=False, model_kwargs={"use_extra_bufts": False})
    generator.warm_up()
    assert generator._shared is not None
    assert generator._shared.llama.model_params.use_extra_bufts is False
    prompt = [ChatMessage.from_user("Question: What is the capital of France?\nAnswer:")]
    assert generator.run(prompt, generation_kwargs={"max_tokens": 4})["replies"][0].text
