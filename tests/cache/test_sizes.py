"""Size options: bytes or "500MB"/"20GiB"-style strings."""

from __future__ import annotations

import pytest

from detload._cache import parse_size
from detload.errors import OptionError


def test_parse_size():
    assert parse_size(None) is None
    assert parse_size(1234) == 1234
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("20GiB") == 20 * 2**30
    assert parse_size("1.5 k") == 1500
    with pytest.raises(OptionError):
        parse_size(True)
