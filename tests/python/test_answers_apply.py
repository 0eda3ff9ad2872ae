"""PeerKVTier applying the library's changed answers to a request's cached
answers: the one-pass path (its first keys in order, all alike) and the
per-position path must leave the same answers."""

import pytest

import peerkv.vllm as vllm_tier  # needs vLLM, as the other tier tests do: never skipped
from peerkv.node import AnswerChange

LookupResult = vllm_tier.LookupResult
MISS, HIT, HIT_PENDING, RETRY = 1, 2, 3, 4  # PEERKV_LOOKUP_*


class _Changes:
    def __init__(self, changes):
        self.changes = changes

    def take_answers(self):
        taken, self.changes = self.changes, []
        return taken


def _applied(order, change_positions, results):
    """The request's answers after one change, through the tier."""
    tier = object.__new__(vllm_tier.PeerKVTier)  # only what _apply_answers reads
    state = vllm_tier._RequestState(True, "r", None)
    state.order = list(order)
    state.answers = dict.fromkeys(order, LookupResult.RETRY)
    tier._tracked = {"r": state}
    tier._node = _Changes([AnswerChange("r", False, change_positions, bytes(results))])
    tier._apply_answers()
    return [state.answers[k] for k in order]


KEYS = [bytes([i]) * 36 for i in range(6)]


@pytest.mark.parametrize(
    "results",
    [[HIT] * 4, [MISS] * 4, [HIT, HIT, MISS, HIT], [HIT_PENDING] * 4],
    ids=["all hit", "all miss", "mixed", "all pending"],
)
def test_a_range_of_first_keys_reads_as_its_positions_would(results):
    as_range = _applied(KEYS, range(4), results)
    as_tuple = _applied(KEYS, tuple(range(4)), results)
    assert as_range == as_tuple
    codes = {MISS: LookupResult.MISS, HIT: LookupResult.HIT, HIT_PENDING: LookupResult.HIT_PENDING}
    assert as_range == [codes[r] for r in results] + [LookupResult.RETRY] * 2  # keys 4, 5: no answer yet


@pytest.mark.parametrize("positions", [range(4), tuple(range(4))], ids=["range", "tuple"])
def test_a_change_past_the_known_keys_fails_alike_on_both_paths(positions):
    """Positions beyond the request's keys cannot come from the library (it
    numbers the keys it was sent); if they did, both paths fail alike."""
    with pytest.raises(IndexError):
        _applied(KEYS[:2], positions, [HIT] * 4)
