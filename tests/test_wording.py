from attnlab.wording import counted


def test_counted_puts_an_s_on_every_count_but_one():
    assert [counted(n, "slot") for n in (0, 1, 2, 16)] == ["0 slots", "1 slot", "2 slots", "16 slots"]
