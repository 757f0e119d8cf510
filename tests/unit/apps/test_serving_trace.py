"""The serving bench's conversation trace, read back by SGLang 0.5.23's own agentic-trace loader (the one
`python -m sglang.bench_serving --dataset-name agentic-trace` uses): seeded, growing, returning, halved."""

from __future__ import annotations

from pathlib import Path

import pytest

from lifeboat_cache.bench.serving_trace import TraceShape, build, halves, write

agentic = pytest.importorskip("sglang.benchmark.datasets.agentic_trace",
                              reason="SGLang's load generator needs `datasets` (requirements/test.txt)")

SHAPE = TraceShape(conversations=5, turns=3, system_words=30, user_words=10, reply_words=5, seed=3)


def load(path: Path, *, count: int = 0, offset: int = 0) -> list:
    ds = agentic.AgenticTraceDataset(dataset_path=str(path), num_requests=count, fixed_output_len=8,
                                     offset=offset, max_turns=None)
    return ds.load(tokenizer=None)


def test_sglang_loads_every_visit_as_one_round_of_the_whole_history(tmp_path: Path) -> None:
    rows = load(write(tmp_path / "trace.json", SHAPE))
    assert len(rows) == SHAPE.visits == 15
    assert all(len(r.prompt) == 1 and r.output_len == 8 for r in rows)  # one round per visit
    by_conv: dict[str, list[list[dict]]] = {}
    for r in rows:
        messages = r.prompt[0]
        assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
        by_conv.setdefault(messages[0]["content"], []).append(messages)
    assert len(by_conv) == SHAPE.conversations  # one system prompt per conversation, none shared
    for visits in by_conv.values():
        assert [len(v) for v in visits] == [2, 4, 6]  # system + (user, assistant) per earlier turn + user
        for before, after in zip(visits, visits[1:]):
            assert after[:len(before)] == before  # a visit's prompt extends the previous one's


def test_conversations_return_after_all_the_others(tmp_path: Path) -> None:
    rows = load(write(tmp_path / "trace.json", SHAPE))
    systems = [r.prompt[0][0]["content"] for r in rows]
    n = SHAPE.conversations
    for turn in range(SHAPE.turns):  # turn t of every conversation before turn t+1 of any
        assert len(set(systems[turn * n:(turn + 1) * n])) == n
        assert [len(r.prompt[0]) for r in rows[turn * n:(turn + 1) * n]] == [2 * turn + 2] * n
    assert systems[:n] != systems[n:2 * n]  # each turn in its own seeded order


def test_same_seed_same_bytes_other_seed_other_text(tmp_path: Path) -> None:
    a, b = write(tmp_path / "a.json", SHAPE), write(tmp_path / "b.json", SHAPE)
    assert a.read_bytes() == b.read_bytes()
    other = build(TraceShape(**{**SHAPE.__dict__, "seed": 4}))
    assert other["conversations"] != build(SHAPE)["conversations"]


def test_halves_are_the_offset_and_count_that_cut_the_run_at_a_turn(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.json", SHAPE)
    (o1, c1), (o2, c2) = halves(SHAPE, 2)
    first, second = load(path, count=c1, offset=o1), load(path, count=c2, offset=o2)
    assert (len(first), len(second)) == (10, 5)
    assert {len(r.prompt[0]) for r in first} == {2, 4} and {len(r.prompt[0]) for r in second} == {6}
    with pytest.raises(ValueError, match="turns_before_restart"):
        halves(SHAPE, 3)


def test_bad_shape_names_the_field() -> None:
    with pytest.raises(ValueError, match="trace conversations: 0 must be a positive integer"):
        build(TraceShape(conversations=0))


def test_command_line_writes_the_trace_and_prints_the_halves(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from lifeboat_cache.bench.serving_trace import main

    out = tmp_path / "t.json"
    assert main([str(out), "--conversations", "5", "--turns", "3", "--system-words", "30", "--user-words", "10",
                 "--reply-words", "5", "--seed", "3", "--turns-before-restart", "2"]) == 0
    assert out.read_bytes() == write(tmp_path / "same.json", SHAPE).read_bytes()
    printed = capsys.readouterr().out
    assert "--dataset-offset 0 --num-prompts 10" in printed and "--dataset-offset 10 --num-prompts 5" in printed
    with pytest.raises(SystemExit):
        main([str(out), "--turns", "0"])
    assert "trace turns: 0 must be a positive integer" in capsys.readouterr().err
