import pytest
import torch

from attnlab.nn.kv_cache import KVCache
from attnlab.nn.masks import causal_mask


# ----------------------------------------------------------------------------- masks
def visible_sets(mask):
    return [set(torch.nonzero(row).flatten().tolist()) for row in mask[0, 0]]


@pytest.mark.parametrize("t,w", [(6, 1), (6, 2), (7, 3), (5, 5), (4, 10)])
def test_window_mask_sees_exactly_the_last_w_keys(t, w):
    m = causal_mask(t, window=w)
    assert m.shape == (1, 1, t, t) and m.dtype == torch.bool
    assert visible_sets(m) == [set(range(max(0, i - w + 1), i + 1)) for i in range(t)]


def test_no_window_is_lower_triangle():
    assert visible_sets(causal_mask(5)) == [set(range(i + 1)) for i in range(5)]


@pytest.mark.parametrize("window", [None, 1, 3, 4])
def test_offset_and_key_start_agree_with_slicing_full_mask(window):
    full = causal_mask(9, window=window)
    for offset in range(0, 8):
        for t in range(1, 9 - offset + 1):
            for key_start in range(0, offset + 1):
                m = causal_mask(t, offset=offset, window=window, key_start=key_start)
                assert m.shape == (1, 1, t, offset + t - key_start)
                assert torch.equal(m, full[:, :, offset:offset + t, key_start:offset + t]), (offset, t, key_start)


@pytest.mark.parametrize("window", [0, -1])
def test_window_below_one_raises(window):
    with pytest.raises(ValueError, match="sliding_window"):
        causal_mask(4, window=window)


# ----------------------------------------------------------------------------- KV cache
B, K, DH = 2, 3, 4


def tokens(first, n):
    """(B, K, n, Dh) keys whose every entry is the absolute position; values = −position."""
    pos = torch.arange(first, first + n, dtype=torch.float32)
    k = pos[None, None, :, None].expand(B, K, n, DH).clone()
    return k, -k


def positions_of(k_all):
    return k_all[0, 0, :, 0].long().tolist()


@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_rolling_cache_one_token_at_a_time(w):
    cache = KVCache(B, K, 2 * w, DH, window=w)
    for pos in range(6 * w + 3):
        k_all, v_all = cache.update(*tokens(pos, 1))
        assert cache.length == pos + 1
        held = cache.length - cache.start
        assert k_all.shape == (B, K, held, DH) and v_all.shape == k_all.shape
        assert positions_of(k_all) == list(range(cache.start, pos + 1))  # the last `held` appended, in order
        assert torch.equal(v_all, -k_all)
        assert held >= min(pos + 1, w)  # the whole window of the newest query is still held
        assert held <= 2 * w


@pytest.mark.parametrize("w,chunks", [(3, [4, 1, 2, 4, 3, 1, 4]), (4, [5, 5, 2, 5, 1]), (2, [1, 3, 3, 2])])
def test_rolling_cache_in_chunks(w, chunks):
    cache = KVCache(B, K, 2 * w, DH, window=w)
    pos = 0
    for n in chunks:
        cache.reserve(n)
        start = cache.start  # final before update (the mask is built from it)
        k_all, _ = cache.update(*tokens(pos, n))
        pos += n
        assert cache.start == start and cache.length == pos
        assert positions_of(k_all) == list(range(cache.start, pos))
        # the first new query (position pos - n) still sees its W - 1 predecessors
        assert cache.start <= max(0, pos - n - (w - 1))


def test_reserve_twice_does_nothing_more():
    cache = KVCache(B, K, 4, DH, window=2)
    cache.update(*tokens(0, 4))
    cache.reserve(2)
    state = (cache.start, cache.length, cache.k.clone())
    cache.reserve(2)
    assert (cache.start, cache.length) == state[:2] and torch.equal(cache.k, state[2])
    assert positions_of(cache.update(*tokens(4, 2))[0]) == [3, 4, 5]


def test_chunk_too_large_for_rolling_cache_raises():
    w, cap = 3, 6
    cache = KVCache(B, K, cap, DH, window=w)
    cache.update(*tokens(0, 5))
    with pytest.raises(ValueError, match="at most 4"):
        cache.update(*tokens(5, cap - w + 2))
    cache.update(*tokens(5, cap - w + 1))  # the largest chunk that fits beside W - 1 kept keys
    assert cache.length == 9 and cache.start == 3


def test_non_window_cache_raises_on_overflow():
    cache = KVCache(B, K, 5, DH)
    cache.update(*tokens(0, 3))
    cache.update(*tokens(3, 2))
    assert positions_of(cache.k) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="overflow"):
        cache.update(*tokens(5, 1))
    assert cache.length == 5 and cache.start == 0


@pytest.mark.parametrize("window", [0, 6])
def test_window_out_of_range_raises(window):
    with pytest.raises(ValueError, match="window"):
        KVCache(B, K, 5, DH, window=window)


def test_memory_bytes_fp32_and_bf16():
    b, k, length, dh = 3, 2, 7, 8
    assert KVCache(b, k, length, dh).memory_bytes() == 2 * b * k * length * dh * 4
    assert KVCache(b, k, length, dh, dtype=torch.bfloat16).memory_bytes() == 2 * b * k * length * dh * 2


def test_reorder_keeps_selected_rows():
    cache = KVCache(3, 1, 4, 2)
    k = torch.arange(3, dtype=torch.float32)[:, None, None, None].expand(3, 1, 2, 2).clone()
    cache.update(k, k)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


def test_a_cache_over_given_tensors_writes_into_them():
    store = torch.zeros(3, 2, 8, 4)  # (S, K, L, Dh): three sequences' caches in one tensor
    cache = KVCache.over(store[1:2], store[1:2].clone(), length=2)
    k = torch.randn(1, 2, 1, 4)
    keys, _ = cache.update(k, k)
    assert cache.length == 3 and keys.shape == (1, 2, 3, 4)
    assert torch.equal(store[1, :, 2], k[0, :, 0]) and not store[0].any() and not store[2].any()
    with pytest.raises(ValueError, match="cannot hold"):
        KVCache.over(store, store, length=9)
    with pytest.raises(ValueError, match="one shape"):
        KVCache.over(store, store[:1])
