"""A multi-turn conversation trace for `python -m sglang.bench_serving --dataset-name agentic-trace`,
written offline and deterministically (seeded) from the demo's public-domain texts.

Why our own file: SGLang's multi-turn loaders read traces that live on a hub (no network here), and the
`serving` bench needs returning users: conversations that grow turn by turn and come back after the
others pushed their KV out of device and host memory (and, across the restart, out of the process).

The shape (SGLang 0.5.23, `benchmark/datasets/agentic_trace.py`): `{"metadata": {...}, "conversations":
[[{"messages": [...], "prompt_tokens": N}, ...], ...]}`. Each entry of `conversations` here is one
*visit*: conversation c at turn t, with its whole history as one round (system prompt, then user and
assistant messages, then the new user message). Earlier answers in the history are the trace's fixed
replies, not the server's: so every server gets byte-identical prompts, and answers compare one by one
(one differing answer does not change every later prompt). Visits are ordered turn by turn: turn 1 of
every conversation (seeded order), then turn 2 of every conversation, ...; with more conversations
than the load generator's concurrency, a conversation's turn t+1 starts after its turn t finished and
after the others' turn t pushed it out. The first `conversations * turns_before_restart` visits are one
half of a run (`--num-prompts`), the rest the other (`--dataset-offset`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FORMAT = "agentic-trace"  # bench_serving's --dataset-name
TOKENS_PER_WORD = 1.4  # SmolLM2's tokenizer on these texts: an estimate for metadata only


@dataclass(frozen=True)
class TraceShape:
    """How many conversations, turns and words; `seed` makes the same file every time."""

    conversations: int = 32
    turns: int = 4
    system_words: int = 200     # per conversation: its own document excerpt (the shared-by-nobody prefix)
    user_words: int = 120       # per user message
    reply_words: int = 40       # per fixed assistant reply in the history
    seed: int = 1

    def check(self) -> None:
        """Raise ValueError naming the field when a value is unusable."""
        for name, value in asdict(self).items():
            if name != "seed" and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"trace {name}: {value!r} must be a positive integer")

    @property
    def visits(self) -> int:
        return self.conversations * self.turns


def _words() -> list[str]:
    from ..demo import DECLARATION, GETTYSBURG

    return re.findall(r"\S+", DECLARATION + "\n" + GETTYSBURG)


def _excerpt(rng: random.Random, words: list[str], n: int) -> str:
    """`n` consecutive words from a seeded place, wrapping around the texts."""
    start = rng.randrange(len(words))
    return " ".join(words[(start + i) % len(words)] for i in range(n))


def conversation(rng: random.Random, words: list[str], index: int, shape: TraceShape) -> list[list[dict[str, str]]]:
    """The message list of each turn's visit (1..turns) of one conversation: histories that grow."""
    system = (f"You are assistant {index} of the LifeboatCache serving benchmark. Conversation {index}'s "
              f"document follows.\n{_excerpt(rng, words, shape.system_words)}")
    history = [{"role": "system", "content": system}]
    visits = []
    for turn in range(1, shape.turns + 1):
        history.append({"role": "user", "content": f"Turn {turn}. {_excerpt(rng, words, shape.user_words)}\n"
                                                    "Answer in one short paragraph."})
        visits.append([dict(m) for m in history])
        history.append({"role": "assistant", "content": _excerpt(rng, words, shape.reply_words)})
    return visits


def build(shape: TraceShape) -> dict[str, Any]:
    """The trace as a dict (see the module doc for the order of the visits)."""
    shape.check()
    rng = random.Random(shape.seed)
    words = _words()
    convs = [conversation(rng, words, c, shape) for c in range(shape.conversations)]
    rows = []
    for turn in range(shape.turns):
        order = list(range(shape.conversations))
        rng.shuffle(order)
        for c in order:
            messages = convs[c][turn]
            words_in = sum(len(m["content"].split()) for m in messages)
            rows.append([{"messages": messages, "prompt_tokens": int(words_in * TOKENS_PER_WORD),
                          "conversation": c, "turn": turn + 1}])
    return {"metadata": {"generator": "lifeboat_cache.bench.serving_trace", **asdict(shape),
                         "visits": len(rows), "order": "turn by turn, conversations in seeded order"},
            "conversations": rows}


def write(path: Path, shape: TraceShape) -> Path:
    """Write the trace as JSON (same bytes for the same shape); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build(shape), indent=0, sort_keys=True))
    return path


def halves(shape: TraceShape, turns_before_restart: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(offset, count) of the visits before and after the restart, for `--dataset-offset` / `--num-prompts`."""
    if not 0 < turns_before_restart < shape.turns:
        raise ValueError(f"turns_before_restart: {turns_before_restart} must be between 1 and turns - 1 "
                         f"({shape.turns - 1}); raise turns or lower it")
    first = shape.conversations * turns_before_restart
    return (0, first), (first, shape.visits - first)


def dataset_args(path: Path, offset: int) -> list[str]:
    """bench_serving's arguments that select this trace from visit `offset` on (`--num-prompts` is the caller's)."""
    return ["--dataset-name", FORMAT, "--dataset-path", str(path), "--dataset-offset", str(offset)]


def main(argv: list[str] | None = None) -> int:
    """`python -m lifeboat_cache.bench.serving_trace OUT.json [--conversations N ...]`: write a trace for
    `python -m sglang.bench_serving --dataset-name agentic-trace` against any server (docs/perf/serving.md)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lifeboat_cache.bench.serving_trace", description=main.__doc__)
    p.add_argument("out", type=Path, help="the trace file to write (JSON)")
    for name, default in asdict(TraceShape()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default, help=f"(default {default})")
    p.add_argument("--turns-before-restart", type=int, default=None,
                   help="also print the --dataset-offset / --num-prompts of the two halves")
    args = p.parse_args(argv)
    shape = TraceShape(**{k: getattr(args, k) for k in asdict(TraceShape())})
    try:
        write(args.out, shape)
        cut = halves(shape, args.turns_before_restart) if args.turns_before_restart else None
    except ValueError as e:
        p.error(str(e))
    print(f"{args.out}: {shape.visits} requests ({shape.conversations} conversations x {shape.turns} turns)")
    if cut:
        for label, (offset, count) in zip(("before", "after"), cut):
            print(f"{label} the restart: --dataset-offset {offset} --num-prompts {count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
