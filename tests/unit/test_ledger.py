"""What a client request is billed: the usage it was sent, by how each choice was answered."""

from __future__ import annotations

from meshserve.gateway.ledger import Bill, Tally
from meshserve.services.gen import meshserve_pb2 as pb


def chunk(tokens: int, kind: str = "", usage: pb.Usage | None = None) -> pb.GenerateResponse:
    return pb.GenerateResponse(token_ids=list(range(tokens)), cache_kind=kind, finish_reason="stop" if usage else "",
                               usage=usage)


def test_a_finished_choice_counts_its_usage_and_the_prompt_counts_once() -> None:
    bill = Bill.of(3)
    for i, sent in enumerate(bill.choices):
        sent.add(chunk(1, "exact" if i == 2 else ""))
        sent.add(chunk(2, usage=pb.Usage(prompt_tokens=10, completion_tokens=3 + i, cached_prompt_tokens=4)))
    assert bill.tallies() == {"generated": Tally(1, 10, 3 + 4, 4), "exact": Tally(0, 0, 5, 0)}
    assert bill.tokens(prompt_estimate=99) == 10 + 3 + 4 + 5


def test_a_stream_cut_short_counts_the_tokens_it_was_sent_and_its_estimated_prompt_against_limits() -> None:
    bill = Bill.of(1)
    bill.choices[0].add(chunk(1, "coalesced"))
    bill.choices[0].add(chunk(2))
    assert bill.tallies() == {"coalesced": Tally(1, 0, 3, 0)}
    assert bill.tokens(prompt_estimate=7) == 7 + 3


def test_a_request_sent_nothing_counts_nowhere() -> None:
    assert Bill.of(2).tallies() == {} and Bill.of(2).tokens(prompt_estimate=5) == 0
