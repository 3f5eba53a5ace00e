"""Size options: bytes or "500MB"/"20GiB"-style strings."""

from __future__ import annotations

import pytest

from detload._cache import parse_size
from detload.errors import OptionError


def test_parse_size():
    assert parse_size(None, "Cache.limit") is None
    assert parse_size(1234, "Cache.limit") == 1234
    assert parse_size("500MB", "Cache.limit") == 500 * 10**6
    assert parse_size("20GiB", "Cache.limit") == 20 * 2**30
    assert parse_size("1.5 k", "Cache.limit") == 1500
    with pytest.raises(OptionError):
        parse_size(True, "Cache.limit")


@pytest.mark.parametrize("bad, says", [
    (True, "must be a byte count"),
    ("lots", "'lots' is not a size"),
    (0, "must be positive"),
])
def test_messages_name_the_option_as_given(bad, says):
    # No default name: a message never names an option the caller did not write.
    for name in ("Cache.limit", "Pool.block_memory", "cache_limit"):
        with pytest.raises(OptionError, match=rf"^{name} .*{says}"):
            parse_size(bad, name)
