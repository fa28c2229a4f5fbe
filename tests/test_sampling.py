import torch

from adtbench.algorithm.sampling import cfg_mix, constrain, process_logits, top_k_filter, top_p_filter
from adtbench.layout import TokenLayout
from adtbench.sampling_params import SamplingParams

INF = float("inf")


def test_cfg_mix_rows():
    c, u = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    assert torch.equal(cfg_mix(c[None], 3.0), c)
    assert torch.allclose(cfg_mix(torch.stack([c, u]), 3.0), u + 3.0 * (c - u))


def test_constrain_image_range_and_forced_tokens():
    lay = TokenLayout(vocab_size=10, image_token_offset=2, num_codes=4, grid_h=2, grid_w=2, eol_token=8, eoi_token=9)
    assert lay.row_len == 3 and lay.num_gen_tokens == 7
    logits = torch.zeros(7, 10)
    out = constrain(logits, torch.arange(7), lay)
    for g in range(7):
        allowed = torch.isfinite(out[g]).nonzero().flatten().tolist()
        if g in (2, 5):
            assert allowed == [8]
        elif g == 6:
            assert allowed == [9]
        else:
            assert allowed == [2, 3, 4, 5]
    codes = lay.tokens_to_codes([2, 3, 8, 4, 5, 8, 9])
    assert codes.tolist() == [[0, 1], [2, 3]]


def test_top_k_keeps_ties_and_top_p_nucleus():
    x = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(top_k_filter(x, 2)).tolist() == [[True, True, True, False]]
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isfinite(top_p_filter(p, 0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(p, 0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(top_p_filter(p, 0.1)).tolist() == [[True, False, False, False]]


def test_process_order_cfg_then_mask_then_temperature():
    lay = TokenLayout(vocab_size=4, image_token_offset=1, num_codes=3, grid_h=1, grid_w=1)
    raw = torch.tensor([[[5.0, 1.0, 2.0, 3.0]], [[0.0, 1.0, 1.0, 1.0]]])
    sp = SamplingParams(temperature=2.0, cfg_scale=2.0)
    out = process_logits(raw, torch.tensor([0]), lay, sp)[0]
    mixed = raw[1, 0] + 2.0 * (raw[0, 0] - raw[1, 0])
    assert out[0] == -INF
    assert torch.allclose(out[1:], mixed[1:] / 2.0)
    greedy = process_logits(raw, torch.tensor([0]), lay, SamplingParams(temperature=0.0, cfg_scale=2.0))[0]
    assert torch.allclose(greedy[1:], mixed[1:])


def test_an_unmasked_layout_adds_no_row_to_a_cfg_mix():
    """Where every token is allowed at every index (``TokenLayout.masks_logits`` False) the processed logits of a CFG
    mix are the mix itself, bit for bit what adding the all-zero row gives; one row (no mix) and a masking layout
    still go through ``constrain``."""
    free = TokenLayout(vocab_size=16, image_token_offset=0, num_codes=16, grid_h=2, grid_w=2)
    assert not free.masks_logits and not free.forces
    assert TokenLayout(16, 1, 15, 2, 2).masks_logits and TokenLayout(17, 0, 16, 2, 2, eol_token=16).masks_logits
    raw = torch.randn(2, 3, 16)
    greedy = SamplingParams(temperature=0.0, cfg_scale=3.0)
    out = process_logits(raw, torch.arange(3), free, greedy)
    assert torch.equal(out, constrain(cfg_mix(raw, 3.0), torch.arange(3), free))
    one = process_logits(raw[:1], 5, free, greedy)
    assert torch.equal(one, raw[0]) and one.untyped_storage().data_ptr() != raw.untyped_storage().data_ptr()
