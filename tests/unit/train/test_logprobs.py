"""Chunked log-probs and entropy from logits of the trailing positions only: the values and gradients of a
full-vocabulary log-softmax over every position, where both exist, and 0 before the kept positions."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.algos.entropy import token_entropy
from rlhf_dyna.train import logprobs as logprobs_module
from rlhf_dyna.train.logprobs import logits_to_keep, token_logprobs

B, T, V = 3, 9, 50


def _reference_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """What the engine computed before: log_softmax over the whole vocabulary at every position."""
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return torch.nn.functional.pad(logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1), (1, 0))


def _reference_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))


@pytest.fixture(params=[1 << 22, 7 * V])  # one chunk; chunks of 7 positions (not dividing B * K)
def chunk(request, monkeypatch):
    monkeypatch.setattr(logprobs_module, "CHUNK_ELEMENTS", request.param)
    return request.param


@pytest.mark.parametrize("keep", [T, 5, 2])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_equal_full_log_softmax(chunk, keep: int, temperature: float) -> None:
    g = torch.Generator().manual_seed(keep)
    full = (3 * torch.randn(B, T, V, generator=g)).requires_grad_(True)
    ids = torch.randint(0, V, (B, T), generator=g)
    kept = full[:, T - keep:]
    got_lp, got_h = token_logprobs(kept, ids, temperature), token_entropy(kept, temperature, length=T)
    want_lp, want_h = _reference_logprobs(full, ids, temperature), _reference_entropy(full, temperature)
    cols = slice(T - keep + 1, T)  # the columns whose predicting logits were kept
    torch.testing.assert_close(got_lp[:, cols], want_lp[:, cols], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_h[:, cols], want_h[:, cols], rtol=0, atol=1e-5)
    assert got_lp[:, : cols.start].abs().max() == 0 and got_h[:, : cols.start].abs().max() == 0
    weights = torch.randn(B, T, generator=g)
    weights[:, : cols.start] = 0  # a loss reads only the kept columns
    (got_grad,) = torch.autograd.grad(((got_lp + got_h) * weights).sum(), full)
    (want_grad,) = torch.autograd.grad(((want_lp + want_h) * weights).sum(), full)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-5)


def test_bf16_logits_are_read_in_fp32(chunk) -> None:
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(B, T, V, generator=g)).bfloat16()
    ids = torch.randint(0, V, (B, T), generator=g)
    got = token_logprobs(logits, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _reference_logprobs(logits, ids, 1.0), rtol=0, atol=1e-5)
    torch.testing.assert_close(token_entropy(logits), _reference_entropy(logits, 1.0), rtol=0, atol=1e-5)


def test_logits_to_keep_starts_one_column_before_the_first_response_token() -> None:
    mask = torch.zeros(3, 10)
    mask[0, 6:9] = 1
    mask[1, 4:10] = 1  # the earliest: column 4, whose log-prob reads the logits of column 3
    assert logits_to_keep(mask) == 7  # columns 3..9
    assert logits_to_keep(torch.zeros(3, 10)) == 2  # no response token: a minimal head, still a graph
    mask[2, 0] = 1  # column 0 has no logits before it: every column is kept
    assert logits_to_keep(mask) == 10


def test_more_logits_than_columns_is_refused() -> None:
    with pytest.raises(ValueError, match="more than the 4 input columns"):
        token_logprobs(torch.zeros(1, 5, V), torch.zeros(1, 4, dtype=torch.long))
