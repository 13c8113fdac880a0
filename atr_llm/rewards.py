"""Binary correctness reward with math-verify: 1 if the completion's final answer equals the gold one.

Gold answers are parsed as ``$gold$``; the completion's last ``\\boxed{}`` (or a plain expression) is
extracted. math-verify enforces its timeouts with SIGALRM, which works only on the main thread: on the
main thread we use them; elsewhere (a trainer's worker thread) the grading runs in a one-process pool
whose worker grades on its own main thread, and a result that does not arrive in time is graded wrong.
A reward call never raises: unparsable output, timeouts and errors score 0 and are counted. Completions in the
arithmetic tasks' own format (steps, then ``\\boxed{integer}``) against an integer gold are graded without
math-verify, with its result (``boxed_integer_grade``).

Truncated completions (cut at ``max_completion_length``: no eos among their token ids) can be given a fixed
reward instead of a grade (``truncated_reward``): DAPO's overlong punishment in its simplest form (Yu et al.,
2025, Sec. 3.4). Without it a policy that pads ``\\boxed{4}}}}}`` to the length cap is graded correct; with
``mask_truncated_completions`` instead, truncation gets no gradient at all and "never stop" becomes an absorbing
state (measured on the CPU demo: README).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

STATUSES = ("correct", "wrong", "unparsable", "timeout", "error")
# the statuses that depend on the text alone (a timeout or an error may not recur): the ones a grade cache keeps
DETERMINISTIC_STATUSES = ("correct", "wrong", "unparsable")


def completion_text(completion) -> str:
    """TRL passes completions as strings or as a list of chat messages: return the assistant text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


@functools.lru_cache(maxsize=4096)
def parsed_gold(gold: str, timeout_seconds: int | None) -> list:
    """math-verify's parse of the gold answer ``$gold$``, cached: a dataset has few distinct answers and every
    completion of a group is graded against the same one (a parse that raises, e.g. on timeout, is not cached)."""
    from math_verify import parse

    return parse(f"${gold}$", parsing_timeout=timeout_seconds)


# steps over digits, spaces, "+ - =" and newlines, then one \boxed{integer} ending the text (the arithmetic tasks' format)
_STEPS_THEN_BOXED_INTEGER = re.compile(r"[0-9 +\-=\n]*\\boxed\{(-?[0-9]{1,100})\}")
_INTEGER = re.compile(r"-?[0-9]{1,100}")


def boxed_integer_grade(completion: str, gold: str) -> tuple[str, str] | None:
    """``(status, extracted)`` without math-verify for a completion made of arithmetic steps (digits, spaces,
    ``+ - =``, newlines) ending in one ``\\boxed{n}``, ``n`` an optionally negative run of digits, against an
    integer gold: ``correct`` iff the two integers are equal, ``n`` extracted as written. That is what math-verify
    returns for every such pair (property test against it; and on the 2.6 M graded samples of the CPU table's
    evaluations: ``experiments/investigations/grading_fast_path.py``), at a few microseconds instead of ~1 ms. ``None`` for any
    other pair, which math-verify grades."""
    match = _STEPS_THEN_BOXED_INTEGER.fullmatch(completion)
    if match is None or _INTEGER.fullmatch(gold) is None:
        return None
    return ("correct" if int(match.group(1)) == int(gold) else "wrong"), match.group(1)


def grade_with_answer(completion: str, gold: str, timeout_seconds: int | None = 5) -> tuple[str, str | None]:
    """``(status, extracted answer)``; status is one of ``STATUSES``: ``boxed_integer_grade`` where it
    applies, else ``math_verify_grade``. Main thread only when timeouts are set."""
    fast = boxed_integer_grade(completion, gold)
    return fast if fast is not None else math_verify_grade(completion, gold, timeout_seconds)


def math_verify_grade(completion: str, gold: str, timeout_seconds: int | None = 5) -> tuple[str, str | None]:
    """``(status, extracted answer)`` by math-verify: the completion's last ``\\boxed{}`` first, else a plain
    expression, against ``$gold$``. Main thread only when timeouts are set."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = parsed_gold(gold, timeout_seconds)
        pred = parse(
            completion,
            extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
            parsing_timeout=timeout_seconds,
        )
        if not pred:
            return "unparsable", None
        extracted = str(pred[-1])
        ok = verify(gold_parsed, pred, timeout_seconds=timeout_seconds)
        return ("correct" if ok else "wrong"), extracted
    except TimeoutException:
        return "timeout", None
    except Exception:  # noqa: BLE001 - a reward must never crash training
        return "error", None


def grade(completion: str, gold: str, timeout_seconds: int | None = 5) -> str:
    """One of ``STATUSES``. Must run on the main thread when ``timeout_seconds`` is set."""
    return grade_with_answer(completion, gold, timeout_seconds)[0]


def _grade_one(args: tuple[str, str, int | None]) -> tuple[str, str | None]:
    completion, gold, timeout = args
    return grade_with_answer(completion, gold, timeout)


def grade_many(
    pairs: list[tuple[str, str]],
    timeout_seconds: int = 5,
    workers: int = 2,
    *,
    grader=_grade_one,
    future_timeout: float | None = None,
) -> list[tuple[str, str | None]]:
    """``(status, extracted)`` for each (completion, gold) pair, graded in worker processes (each grades on
    its own main thread, so math-verify's timeouts work). A grade that does not return within
    ``future_timeout`` (default ``10 * timeout_seconds + 30`` s) counts as ``timeout``; its worker is killed."""
    if not pairs:
        return []
    # equal pairs are graded once (GRPO's groups and Mean@k repeat texts); the ones boxed_integer_grade settles are
    # not sent to a worker
    by_pair = {p: boxed_integer_grade(*p) for p in dict.fromkeys(pairs)} if grader is _grade_one else {}
    distinct = [p for p in dict.fromkeys(pairs) if by_pair.get(p) is None]
    if not distinct:
        return [by_pair[p] for p in pairs]
    results = []
    wait = 10 * timeout_seconds + 30 if future_timeout is None else future_timeout
    pool = ProcessPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(grader, (c, g, timeout_seconds)) for c, g in distinct]
        for f in futures:
            try:
                results.append(f.result(timeout=wait))
            except FutureTimeout:
                results.append(("timeout", None))
            except Exception:  # noqa: BLE001
                results.append(("error", None))
    finally:
        for proc in list(getattr(pool, "_processes", {}).values()):  # a stuck grader must not hang the run
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
    by_pair.update(zip(distinct, results))
    return [by_pair[p] for p in pairs]


def check_truncated_reward(value: float | None) -> None:
    """``truncated_reward`` is None (grade truncated completions) or a finite number; else ValueError."""
    if value is not None and (isinstance(value, bool) or not math.isfinite(float(value))):
        raise ValueError(f"truncated_reward must be a finite number or None, got {value!r}")


def is_truncated(completion_ids, eos_token_ids) -> bool:
    """A completion was cut at the length cap: none of its token ids is an eos id."""
    return not any(int(t) in eos_token_ids for t in completion_ids)


class CorrectnessReward:
    """``reward(prompts, completions, answer, **kw) -> list[float]`` for TRL, with counters.

    ``truncated_reward`` (with ``eos_token_ids``): the reward of a completion whose ``completion_ids`` (which
    TRL passes) hold no eos id, given instead of its grade and counted as ``truncated``; ``None`` grades every
    completion. ``stats`` counts the statuses since the last ``pop_stats`` (the trainer logs them).

    Grades are cached: a (completion, gold) pair already graded ``correct`` / ``wrong`` / ``unparsable`` is not
    graded again (at most ``cache_size`` pairs, the oldest dropped first; ``cache_size=0`` turns it off), and equal
    pairs in one call are graded once. Grading is a function of the two strings, so rewards are unchanged (test).
    math-verify costs ~1 ms a pair on this machine's CPU (16% of a cpu-table GRPO step); in the first 30 steps of
    such a run 30% of the pairs repeat an earlier one (a group samples the same text, a prompt comes back).
    """

    __name__ = "correctness"

    def __init__(
        self,
        timeout_seconds: int = 5,
        workers: int = 2,
        *,
        truncated_reward: float | None = None,
        eos_token_ids: Iterable[int] = (),
        cache_size: int = 100_000,
    ):
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a non-negative int (0: no cache), got {cache_size!r}")
        self.cache_size = cache_size
        self._cache: dict[tuple[str, str], str] = {}
        self.timeout_seconds = timeout_seconds
        self.workers = workers
        check_truncated_reward(truncated_reward)
        self.truncated_reward = None if truncated_reward is None else float(truncated_reward)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        if self.truncated_reward is not None and not self.eos_token_ids:
            raise ValueError("truncated_reward needs eos_token_ids (how else is a truncated completion recognised?)")
        self.stats: Counter = Counter()

    def _grade_uncached(self, pairs: list[tuple[str, str]]) -> list[str]:
        if threading.current_thread() is threading.main_thread():
            return [grade(c, g, self.timeout_seconds) for c, g in pairs]
        return [status for status, _ in grade_many(pairs, self.timeout_seconds, self.workers)]

    def _grade_all(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Statuses of ``pairs``: cached ones from the cache, the distinct others graded once each."""
        todo = [p for p in dict.fromkeys(pairs) if p not in self._cache]
        fresh = dict(zip(todo, self._grade_uncached(todo)))
        statuses = [fresh[p] if p in fresh else self._cache[p] for p in pairs]
        if self.cache_size:
            self._cache.update((p, s) for p, s in fresh.items() if s in DETERMINISTIC_STATUSES)
            excess = len(self._cache) - self.cache_size
            if excess > 0:
                for p in list(itertools.islice(self._cache, excess)):
                    del self._cache[p]  # insertion order: the oldest first
        return statuses

    def __call__(self, prompts=None, completions=None, answer=None, completion_ids=None, **kwargs) -> list[float]:
        completions = completions or []
        answers = answer if answer is not None else kwargs.get("solution", [""] * len(completions))
        pairs = [(completion_text(c), str(a)) for c, a in zip(completions, answers)]
        cut = [False] * len(pairs)
        if self.truncated_reward is not None:
            if completion_ids is None:
                raise ValueError("truncated_reward is set but the trainer passed no completion_ids")
            cut = [is_truncated(ids, self.eos_token_ids) for ids in completion_ids]
        graded = [p for p, c in zip(pairs, cut) if not c]
        try:
            grades = iter(self._grade_all(graded))
        except Exception:  # noqa: BLE001
            grades = iter(["error"] * len(graded))
        statuses = ["truncated" if c else next(grades) for c in cut]
        self.stats.update(statuses)
        return [self.truncated_reward if s == "truncated" else 1.0 if s == "correct" else 0.0 for s in statuses]

    def pop_stats(self) -> dict[str, float]:
        """Fractions of each status since the last call (empty dict if nothing was graded)."""
        n = sum(self.stats.values())
        keys = STATUSES if self.truncated_reward is None else (*STATUSES, "truncated")
        out = {f"reward/{k}_frac": self.stats[k] / n for k in keys} if n else {}
        self.stats.clear()
        return out


REWARD_CONTROLS = ("none", "shuffled")
"""``reward_control`` values: ``none`` trains on the rewards as graded; ``shuffled`` is the no-signal control."""


def group_permutations(group_size: int, groups: int, seed: int, step: int, call: int = 0):
    """One permutation of ``range(group_size)`` per group, drawn from numpy's PCG64 seeded with
    ``(seed, step, call)``: the same draw for the same training step whatever happened before it (a resumed run
    shuffles as the uninterrupted one did)."""
    import numpy as np

    rng = np.random.default_rng([int(seed), int(step), int(call)])
    return [rng.permutation(group_size) for _ in range(groups)]


class GroupShuffledReward:
    """The no-signal control (``reward_control: shuffled``): ``reward`` (e.g. ``CorrectnessReward``) grades the
    completions as usual, then the rewards are permuted within each group of ``group_size`` consecutive completions
    (one prompt's completions, in TRL's order). Each group keeps its reward distribution (so its mean, standard
    deviation, GRPO's advantage scale and the fraction of all-equal groups are unchanged) while which completion
    gets which reward is random: the policy gradient has no information about correctness. A study runs it beside
    its rules to tell learning from noise amplified by batch reuse.

    The permutation of a call is ``group_permutations(group_size, groups, seed, step, call)``, with ``step`` the
    trainer's ``global_step`` (TRL passes ``trainer_state``) and ``call`` the count of earlier calls at that step, so
    a resumed run draws what the uninterrupted one drew. The batch must hold whole groups: one process (or a local
    batch that is a multiple of ``group_size``), else ValueError. ``pop_stats`` passes the grader's counts through
    (they are of the graded, unshuffled rewards)."""

    def __init__(self, reward, group_size: int, seed: int):
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(f"group_size must be an integer >= 2 (a group to shuffle within), got {group_size!r}")
        self.reward, self.group_size, self.seed = reward, group_size, int(seed)
        self.__name__ = getattr(reward, "__name__", "reward")
        self._calls_at: tuple[int, int] = (-1, 0)  # (step, calls made at that step)

    def __call__(self, *args, trainer_state=None, **kwargs) -> list[float]:
        graded = list(self.reward(*args, trainer_state=trainer_state, **kwargs))
        if len(graded) % self.group_size:
            raise ValueError(
                f"reward_control 'shuffled' needs whole groups in each reward call: got {len(graded)} completions, "
                f"not a multiple of num_generations = {self.group_size} (train on one process, or with a per-device "
                "batch that is a multiple of num_generations)"
            )
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        call = self._calls_at[1] if self._calls_at[0] == step else 0
        self._calls_at = (step, call + 1)
        groups = len(graded) // self.group_size
        shuffled = []
        for g, order in enumerate(group_permutations(self.group_size, groups, self.seed, step, call)):
            block = graded[g * self.group_size : (g + 1) * self.group_size]
            shuffled += [block[int(i)] for i in order]
        return shuffled

    def pop_stats(self) -> dict[str, float]:
        return self.reward.pop_stats() if hasattr(self.reward, "pop_stats") else {}
