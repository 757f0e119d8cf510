"""The `serving` bench's second traffic: SGLang's own `generated-shared-prefix` dataset, groups of users that
share one long system prompt (one assistant's instructions, one RAG template), each with a question of its own.

SGLang's generator writes the prompts itself (random tokens, seeded by `--seed`; SGLang 0.5.23,
`benchmark/datasets/generated_shared_prefix.py`), so every server gets the same prompts in the same order
and answers compare one by one. Both halves of a run send the whole set: the first half to a new server
on an empty store, the second to the server started after the restart, where every group's system prompt
(and every user's whole prompt) comes back to a process that has never seen it.
"""

from __future__ import annotations

from dataclasses import dataclass

DATASET = "generated-shared-prefix"  # bench_serving's --dataset-name


@dataclass(frozen=True)
class SharedPrefixShape:
    """Groups x users per group; the system prompt's and each question's length in tokens."""

    groups: int = 8
    per_group: int = 6
    system_tokens: int = 900
    question_tokens: int = 48

    @classmethod
    def parse(cls, text: str) -> "SharedPrefixShape":
        """`groups,per_group,system_tokens,question_tokens` (the `serving_shared_prefix` size)."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 4 or min(values) <= 0:
            raise ValueError(f"--size serving_shared_prefix={text}: four positive integers, groups,users per "
                             "group,system-prompt tokens,question tokens (e.g. 8,6,900,48)")
        return cls(*values)

    @property
    def visits(self) -> int:
        return self.groups * self.per_group

    @property
    def distinct_tokens(self) -> int:
        """The traffic's distinct prompt tokens (what storage holds for it), by the requested lengths."""
        return self.groups * self.system_tokens + self.visits * self.question_tokens

    def args(self, output_tokens: int) -> list[str]:
        """bench_serving's dataset arguments for this shape (`--num-prompts` is the caller's)."""
        return ["--dataset-name", DATASET, "--gsp-num-groups", str(self.groups),
                "--gsp-prompts-per-group", str(self.per_group), "--gsp-system-prompt-len", str(self.system_tokens),
                "--gsp-question-len", str(self.question_tokens), "--gsp-output-len", str(output_tokens)]

    def halves(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(offset, count) before and after the restart: the whole set each time."""
        return (0, self.visits), (0, self.visits)
